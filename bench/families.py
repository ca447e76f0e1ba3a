"""Each feature family's cost on one checkpoint, measured against its estimate:
``python -m bench features --models pythia-70m-shaped,pythia-160m-shaped,pythia-410m-shaped [--families a,b]``.

For every model shape (:data:`bench.features.SURFACE_MODELS`: our GPT with the Pythia block shapes, our
128-character vocabulary, context 128, a random init of seed 0) and every family (default all of
``FEATURE_FAMILIES``), one **fresh process** computes that checkpoint's rows with ``features.families`` = that
family alone, as a features worker does (:func:`bench.device._rows`: checkpoint index 0, so the loss-surface
families run; the offline corpus' validation windows; ``features.*`` at params.yaml's values), torch and BLAS on
one thread. It reports

* ``cpu_s``: the CPU seconds of the family's rows (``time.process_time`` around them: model building and imports
  left out);
* ``peak_mb``: the process's peak resident memory (``ru_maxrss``, MiB): the model, the batches, the imports and
  the family's own work: what a machine must hold to run the family;
* ``ready_mb``: the resident memory just before the family started (so ``peak_mb - ready_mb`` is the family's own);

beside what :mod:`topometrics.execution.cost` estimates for it from the parameter count (``estimate_s``,
``estimate_peak_mb``, and the measured rate in the cost model's units, ``s_per_million``; the five weight
families share one estimate, ``weights``, which is compared with their sum;
``representation`` and ``distance`` have none). A family in its own process pays for its own forward and backward
pass; on one checkpoint with every family those are shared (``python -m bench device --sections families``), so
the column sums are an upper bound on one checkpoint's cost. Progress: one line per family with the running ETA
(the estimates of what is left, scaled by measured over estimated so far) and the family's whole row, so a run
stopped part way keeps every finished one; the last line is the JSON of all.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.device import _rows, offline_corpus, random_checkpoint
from bench.features import SURFACE_MODELS
from topometrics.execution.compute import one_thread
from topometrics.execution.cost import GROUP, SECONDS_PER_MILLION, checkpoint_costs
from topometrics.models.model import GPT
from topometrics.models.tokens import load_tokens
from topometrics.params import FEATURE_FAMILIES, load_params

MIB = 1 << 20


def child(model: str, family: str, corpus: Path, params: Path) -> dict:
    """In this (fresh) process: ``family`` alone on one random-init checkpoint of the ``model`` shape."""
    config, state = random_checkpoint(model)
    n_params = sum(v.numel() for v in state.values())
    features = dataclasses.replace(load_params(params).features, device="cpu", workers=1, families=(family,))
    tokens = load_tokens(corpus, "val")
    ready = resident_bytes()
    with one_thread():
        start = time.process_time()
        rows = _rows(state, config, tokens, features)
        cpu = time.process_time() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    # every row of the schema comes back; a family that is off leaves NaN, so ``values`` counts the measured ones
    values = sum(row[2] == row[2] for row in rows)
    return {"model": model, "family": family, "n_params": n_params, "values": values, "cpu_s": round(cpu, 2),
            "peak_mb": round(peak / MIB), "ready_mb": round(ready / MIB)}  # fmt: skip


def resident_bytes() -> int:
    """This process's resident memory now (``VmRSS`` of /proc/self/status)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def estimates(n_params: int, families: tuple[str, ...]) -> dict[str, tuple[float, int]]:
    """Rate key (``weights`` for the five weight families) -> (seconds, peak bytes) the cost model gives."""
    return {c.family: (c.seconds, c.peak_bytes) for c in checkpoint_costs(n_params, families)}


def family_table(models: list[str], families: tuple[str, ...], params: Path) -> dict:
    """Every (model, family) in its own process, in order; progress on stdout; ``{model: {family: row}}``."""
    sizes = {m: _parameters(SURFACE_MODELS[m]) for m in models}
    guess = {(m, f): _estimate_s(sizes[m], f) for m in models for f in families}
    found: dict[str, dict[str, dict]] = {m: {} for m in models}
    measured = estimated = 0.0
    with tempfile.TemporaryDirectory(prefix="bench-families-") as tmp:
        corpus = offline_corpus(Path(tmp) / "corpus")
        jobs = [(m, f) for m in models for f in families]
        for i, (model, family) in enumerate(jobs, 1):
            row = _run_child(model, family, corpus, params)
            found[model][family] = row
            if family in SECONDS_PER_MILLION:  # a rate of its own: the ETA's scale (a weight family's is a share)
                measured, estimated = measured + row["cpu_s"], estimated + guess[model, family]
            left = sum(guess[j] for j in jobs[i:]) * (measured / estimated if estimated else 1.0)
            print(f"families: {model} {family} {row['cpu_s']:.1f} s of CPU, peak {row['peak_mb']:,} MiB "
                  f"({i} of {len(jobs)}; ETA ~{left / 60:.0f} min) {json.dumps(row)}", flush=True)  # fmt: skip
    return {m: with_estimates(found[m], sizes[m]) for m in models}


def with_estimates(rows: dict[str, dict], n_params: int) -> dict[str, dict]:
    """One model's measured rows, each rated family with its estimate beside it, and the five weight families
    also summed as ``weights`` (CPU seconds added, the largest peak), which is what their one estimate covers."""
    out = dict(rows)
    members = [f for f in rows if GROUP.get(f) == "weights"]
    if members:
        out["weights"] = {"members": members, "cpu_s": round(sum(rows[f]["cpu_s"] for f in members), 2),
                          "peak_mb": max(rows[f]["peak_mb"] for f in members)}  # fmt: skip
    for key, (seconds, peak) in estimates(n_params, tuple(rows)).items():
        measured_rate = out[key]["cpu_s"] / (n_params / 1e6)  # the cost model's units: s per million parameters
        out[key] = out[key] | {"estimate_s": round(seconds, 1), "estimate_peak_mb": round(peak / MIB),
                               "s_per_million": round(measured_rate, 4)}  # fmt: skip
    return out


def _parameters(config) -> int:
    """The parameter count of our GPT of ``config``'s shape with our 128-character vocabulary (nothing allocated)."""
    with torch.device("meta"):
        return sum(p.numel() for p in GPT(dataclasses.replace(config, vocab_size=128)).state_dict().values())


def _estimate_s(n_params: int, family: str) -> float:
    """The cost model's seconds for ``family`` (a weight family: its group's over 5), else 1 s: the ETA's parts."""
    est = estimates(n_params, (family,))
    key = GROUP.get(family, family)
    return est[key][0] / (5 if key in GROUP.values() else 1) if key in est else 1.0


def _run_child(model: str, family: str, corpus: Path, params: Path) -> dict:
    """``child`` in a fresh interpreter (its peak memory its own); its last stdout line is the row."""
    cmd = [sys.executable, "-m", "bench.families", "--child", model, family, str(corpus), str(params)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"bench families: {model} {family} failed (exit {done.returncode}): {tail}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(models: list[str], families_arg: str, params: Path) -> int:
    """``python -m bench features --models ...`` without ``--surface``/``--dynamics``."""
    families = tuple(f for f in families_arg.split(",") if f) or FEATURE_FAMILIES
    if unknown := [f for f in families if f not in FEATURE_FAMILIES]:
        raise SystemExit(f"--families: unknown {unknown}; choose from {','.join(FEATURE_FAMILIES)}")
    start = time.perf_counter()
    found = family_table(models, families, params)
    print(f"families: {len(models) * len(families)} processes in {time.perf_counter() - start:.0f} s")
    print(json.dumps({"threads": 1, **found}))
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m bench.families")
    ap.add_argument("--child", nargs=4, metavar=("MODEL", "FAMILY", "CORPUS", "PARAMS"), required=True)
    model, family, corpus, params = ap.parse_args().child
    print(json.dumps(child(model, family, Path(corpus), Path(params))))
