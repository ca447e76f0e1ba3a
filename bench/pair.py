"""One checkpoint's features under this checkout's code and under another revision's, back to back:
``python -m bench pair --against REV [--model pythia-160m-shaped] [--families a,b] [--repeats 2]``.

A speed-up is only a ratio of two measurements made under the same load, and the code a target was set against
is an older commit. This bench checks ``REV`` out into a temporary git worktree and alternates (REV, this
checkout) ``--repeats`` times, each in a **fresh process** whose ``topometrics`` is that checkout's
(``PYTHONPATH``, which comes before the environment's editable install). Each process builds one random-init
checkpoint of the ``--model`` shape (``bench.features.SURFACE_MODELS``: our GPT with the Pythia block
shapes, our 128-character vocabulary, context 128, GPT-2 init of seed 0), reads the offline corpus'
validation windows and times that checkout's ``features.checkpoint.checkpoint_features`` with
``features.families`` = ``--families`` (default: every family but the loss surface's, which that path
computes only at its loss-surface checkpoints), torch and BLAS on one thread, ``features.*`` at that
checkout's params.yaml. It reports per process the CPU seconds, the peak resident memory (``ru_maxrss``),
and the count of finite values; then the ratio of the medians (REV over this checkout) and, per feature, the
largest relative difference between the two codes' values (features whose definition draws random numbers
differ by design; the rest should be equal). The child imports nothing of ``bench`` and reads the API both
revisions share, so it stays runnable against older commits.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NOT_SURFACE = "np,vr,spectral,scale_free,heavy_tail,gradient,representation,gradient_topology,distance,trajectory"


def child(shape: tuple[int, int, int], families: tuple[str, ...], corpus: Path) -> dict:
    """In a fresh process whose ``topometrics`` is the checkout to time: one checkpoint's rows and their cost."""
    import dataclasses
    import resource

    import torch

    from topometrics.execution.compute import one_thread
    from topometrics.features import checkpoint as ck
    from topometrics.features.gradient_cloud import gradient_batch
    from topometrics.models.model import GPT, GPTConfig
    from topometrics.models.tokens import load_tokens
    from topometrics.params import load_params

    try:  # the forward pass's helpers left features.checkpoint for features.forward on 2026-11-28
        from topometrics.features.forward import surface_batch, validation_batch
    except ImportError:
        surface_batch, validation_batch = ck.surface_batch, ck.validation_batch
    checkout = Path(ck.__file__).resolve().parents[2]
    hidden, layers, heads = shape
    config = GPTConfig(hidden=hidden, layers=layers, heads=heads, vocab_size=128)
    model = GPT(config)
    model.init_weights(torch.Generator().manual_seed(0))
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    del model
    features = dataclasses.replace(load_params(checkout / "params.yaml").features, workers=1, families=families)
    if hasattr(features, "device"):  # the families' device arrived later; older code runs on the CPU
        features = dataclasses.replace(features, device="cpu")
    tokens = load_tokens(corpus, "val")
    with one_thread():
        batch = validation_batch(tokens, config.context, features.rep_batch)
        surface = surface_batch(tokens, config.context, features, 0)
        gradients = gradient_batch(tokens, config.context, features)
        start = time.process_time()
        rows = ck.checkpoint_features(state, config, batch, features, surface, gradients=gradients).rows
        cpu = time.process_time() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    values = {f"{row[0]}|{row[1]}": float(row[2]) for row in rows}
    return {"checkout": str(checkout), "cpu_s": round(cpu, 2), "peak_mib": round(peak / 2**20),
            "finite": sum(math.isfinite(v) for v in values.values()), "values": values}  # fmt: skip


def run_child(checkout: Path, shape: str, families: str, corpus: Path) -> dict:
    """:func:`child` in a fresh interpreter whose ``topometrics`` is ``checkout``'s; its last stdout line.
    ``shape``: ``"hidden,layers,heads"`` (numbers: the child imports no ``bench``)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", shape, families, str(corpus)]
    env = dict(os.environ, PYTHONPATH=str(checkout))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"bench pair: {checkout} failed (exit {done.returncode}): {tail}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def largest_differences(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """Feature name (the part after ``layer|``) -> the largest ``|a − b| / max(|a|, |b|)`` over its rows, for the
    rows both have; a value NaN on one side only counts as infinite; equal or both-NaN rows as 0."""
    worst: dict[str, float] = {}
    for key in a.keys() & b.keys():
        x, y = a[key], b[key]
        if x == y or (math.isnan(x) and math.isnan(y)):
            diff = 0.0
        elif math.isnan(x) or math.isnan(y):
            diff = math.inf
        else:
            diff = abs(x - y) / max(abs(x), abs(y))
        name = key.split("|", 1)[1]
        worst[name] = max(worst.get(name, 0.0), diff)
    return dict(sorted(worst.items(), key=lambda kv: (-kv[1], kv[0])))


def _left_s(found: dict[str, list[dict]], repeats: int) -> float:
    """Seconds the processes still to run should take, at each side's mean so far (the other side's if none)."""
    means = {side: statistics.mean(r["cpu_s"] for r in rows) for side, rows in found.items() if rows}
    fallback = statistics.mean(means.values())
    return sum((repeats - len(rows)) * means.get(side, fallback) for side, rows in found.items())


def git_worktree(rev: str, where: Path) -> Path:
    """A detached worktree of ``rev`` at ``where``; exits with one line if ``rev`` is not a revision here."""
    done = subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(where), rev],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode:
        raise SystemExit(f"bench pair: --against {rev}: {done.stderr.strip() or 'git worktree add failed'}")
    return where


def main(argv: list[str]) -> int:
    from bench.features import SURFACE_MODELS  # this checkout's (the child imports no bench)

    ap = argparse.ArgumentParser(prog="python -m bench pair", description=__doc__.splitlines()[0])
    ap.add_argument("--against", required=True, help="the older revision (a commit, tag or branch)")
    ap.add_argument("--model", choices=sorted(SURFACE_MODELS), default="pythia-160m-shaped")
    ap.add_argument("--families", default=NOT_SURFACE, help="comma-separated (default: all but the loss surface)")
    ap.add_argument("--repeats", type=int, default=2, help="alternations of (REV, this checkout)")
    args = ap.parse_args(argv)
    from bench.device import offline_corpus  # this checkout's: the corpus files both revisions read

    config = SURFACE_MODELS[args.model]
    shape = f"{config.hidden},{config.layers},{config.heads}"

    with tempfile.TemporaryDirectory(prefix="bench-pair-") as tmp:
        corpus, old = offline_corpus(Path(tmp) / "corpus"), Path(tmp) / "against"
        git_worktree(args.against, old)
        try:
            found: dict[str, list[dict]] = {"against": [], "this": []}
            for i in range(args.repeats):
                for side, checkout in (("against", old), ("this", REPO)):
                    row = run_child(checkout, shape, args.families, corpus)
                    found[side].append(row)
                    print(f"pair: {side} ({i + 1} of {args.repeats}) {row['cpu_s']:.1f} s of CPU, peak "
                          f"{row['peak_mib']:,} MiB, {row['finite']} finite values (load {os.getloadavg()[0]:.1f}); "
                          f"ETA ~{_left_s(found, args.repeats) / 60:.1f} min", flush=True)  # fmt: skip
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)], check=False)
    medians = {side: statistics.median(r["cpu_s"] for r in rows) for side, rows in found.items()}
    differences = largest_differences(found["against"][0]["values"], found["this"][0]["values"])
    result = {"against": args.against, "model": args.model, "families": args.families.split(","),
              "cpu_s": {side: [r["cpu_s"] for r in rows] for side, rows in found.items()},
              "peak_mib": {side: [r["peak_mib"] for r in rows] for side, rows in found.items()},
              "speedup": round(medians["against"] / medians["this"], 2),
              "largest_difference": differences}  # fmt: skip
    print(f"pair: {args.against} {medians['against']:.1f} s -> this checkout {medians['this']:.1f} s "
          f"of CPU (median of {args.repeats}): {result['speedup']}x")  # fmt: skip
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    if sys.path[0] == str(Path(__file__).resolve().parent):  # run by path: bench/'s modules must not shadow any
        sys.path.pop(0)
    ap = argparse.ArgumentParser(prog="bench/pair.py")
    ap.add_argument("--child", nargs=3, metavar=("HIDDEN,LAYERS,HEADS", "FAMILIES", "CORPUS"), required=True)
    shape, families, corpus = ap.parse_args().child
    hidden, layers, heads = (int(v) for v in shape.split(","))
    print(json.dumps(child((hidden, layers, heads), tuple(f for f in families.split(",") if f), Path(corpus))))
