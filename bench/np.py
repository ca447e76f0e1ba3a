"""Neural-persistence speed: ``python -m bench np [--repeats N]``.

Times :func:`topometrics.measures.neural_persistence.bipartite_max_spanning_tree` (the whole cost of NP) on a
2048x8192 float32 Gaussian layer (a Pythia-1B MLP shape) and on a trained-like layer of the same
shape (log-normal row and column scales, 10% dead rows, 2% dead columns), against
``np.abs(W).max()`` measured in the same run. Prints medians and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from topometrics.measures.neural_persistence import bipartite_max_spanning_tree

SHAPE = (2048, 8192)


def gaussian_layer(shape: tuple[int, int], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def trained_like_layer(shape: tuple[int, int], seed: int) -> np.ndarray:
    """Gaussian entries times log-normal row (sigma 1) and column (sigma 0.5) scales, with dead units."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(shape, dtype=np.float32)
    w *= np.exp(rng.standard_normal((shape[0], 1))).astype(np.float32)
    w *= np.exp(0.5 * rng.standard_normal((1, shape[1]))).astype(np.float32)
    w[rng.random(shape[0]) < 0.1] = 0.0
    w[:, rng.random(shape[1]) < 0.02] = 0.0
    return w


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up: page faults and first-call overheads
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e3)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench np")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    key = f"{SHAPE[0]}x{SHAPE[1]}"
    layers = {"gaussian": gaussian_layer(SHAPE, 0), "trained_like": trained_like_layer(SHAPE, 1)}
    absmax, np_ms = {}, {}
    # Interleave the reference and the algorithm so machine load affects both alike.
    for name, w in layers.items():
        absmax[name] = median_ms(lambda w=w: np.abs(w).max(), args.repeats)
        np_ms[name] = median_ms(lambda w=w: bipartite_max_spanning_tree(w), args.repeats)
        print(
            f"{name:13s} {key}: np {np_ms[name]:7.1f} ms   abs-max {absmax[name]:6.1f} ms   "
            f"ratio {np_ms[name] / absmax[name]:.2f}"
        )
    result = {
        "np_ms": {key: round(np_ms["gaussian"], 2), f"{key}_trained_like": round(np_ms["trained_like"], 2)},
        "absmax_ms": {key: round(absmax["gaussian"], 2), f"{key}_trained_like": round(absmax["trained_like"], 2)},
        "ratio": {
            key: round(np_ms["gaussian"] / absmax["gaussian"], 2),
            f"{key}_trained_like": round(np_ms["trained_like"] / absmax["trained_like"], 2),
        },
    }
    print(json.dumps(result))
    return 0
