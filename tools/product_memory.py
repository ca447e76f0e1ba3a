"""What one exact Hessian-vector product holds, by stage: RSS above the model over one window's passes.

    python tools/product_memory.py [--model pythia-70m-shaped] [--context 128]

Builds our GPT at a shape of ``bench.features.SURFACE_MODELS`` (random init, seed 0; our 128-token vocabulary), one
window of ``--context`` random tokens, and runs the passes ``slice.exact_hvp`` makes, each stage alone: the forward
with its graph kept, the first backward without and with ``create_graph`` (each gradient dropped as it arrives),
the first backward keeping the dots for the second pass, and both passes (their result not kept). Each line is the
stage's peak resident memory above the RSS it started from (RSS sampled every 2 ms in a thread, the C heap handed
back before each stage), in MiB and in float32 vectors of the model's size. One thread. The numbers are what the
double backward itself holds, whatever keeps the Lanczos vectors (docs/performance.md, "Every family at the Pythia
shapes").
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import threading
import time
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.families import MIB, resident_bytes  # noqa: E402
from bench.features import SURFACE_MODELS  # noqa: E402
from topometrics.landscape.slice import _DotWithShare, _hooked, _return_freed_heap, functional_loss  # noqa: E402
from topometrics.models.model import GPT  # noqa: E402


class Peak:
    """The largest RSS seen since :meth:`reset`, sampled in a daemon thread."""

    def __init__(self) -> None:
        self.value = resident_bytes()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while True:
            self.value = max(self.value, resident_bytes())
            time.sleep(0.002)

    def reset(self) -> int:
        self.value = now = resident_bytes()
        return now


def stages(model: GPT, tokens: torch.Tensor) -> dict:
    """Name -> a callable running that stage of one exact product on the window ``tokens`` ``(1, context + 1)``."""
    x, y = tokens[:, :-1], tokens[:, 1:]
    loss = functional_loss(model, lambda call: F.cross_entropy(call(x).flatten(0, 1), y.flatten()))
    leaves = {k: v.detach().requires_grad_(True) for k, v in model.named_parameters()}
    tangent = {k: torch.randn_like(p) for k, p in leaves.items()}
    names = {id(p): k for k, p in leaves.items()}

    def forward() -> None:
        with torch.enable_grad():
            kept = loss(leaves)
            time.sleep(0.02)  # the sampler sees the graph before it goes
        del kept

    def first(create_graph: bool, keep: bool) -> list:
        terms = []

        def dotted(p: torch.Tensor) -> None:
            if keep:
                terms.append(_DotWithShare.apply(p.grad, functools.partial(tangent.__getitem__, names[id(p)])))
            p.grad = None

        with _hooked(leaves.values(), dotted):
            torch.autograd.backward(loss(leaves), inputs=list(leaves.values()), create_graph=create_graph)
        time.sleep(0.02)
        return terms

    def both() -> None:
        terms = first(True, True)

        def dropped(p: torch.Tensor) -> None:
            p.grad = None

        with _hooked(leaves.values(), dropped):
            torch.autograd.backward(torch.stack(terms).sum(), inputs=list(leaves.values()))

    return {
        "forward, its graph kept": forward,
        "first backward": lambda: first(False, False),
        "first backward, create_graph": lambda: first(True, False),
        "first backward, create_graph, dots kept": lambda: first(True, True),
        "both passes": both,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="pythia-70m-shaped", choices=sorted(SURFACE_MODELS))
    ap.add_argument("--context", type=int, default=128)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    config = dataclasses.replace(SURFACE_MODELS[args.model], vocab_size=128, context=args.context)
    model = GPT(config)
    model.init_weights(torch.Generator().manual_seed(0))
    tokens = torch.randint(0, 128, (1, args.context + 1), generator=torch.Generator().manual_seed(1))
    vector = sum(p.numel() for p in model.parameters()) * 4  # bytes
    peak, found = Peak(), {}
    print(f"{args.model}: one float32 vector of the model's size is {vector / MIB:.1f} MiB", flush=True)
    for name, stage in stages(model, tokens).items():
        _return_freed_heap()
        start = peak.reset()
        stage()
        time.sleep(0.02)
        above = max(peak.value - start, 0)
        found[name] = {"mib": round(above / MIB, 1), "vectors": round(above / vector, 2)}
        print(f"  {name:42s} {above / MIB:8.1f} MiB = {above / vector:5.2f} vectors", flush=True)
    return found


if __name__ == "__main__":
    main()
