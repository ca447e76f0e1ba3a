"""Features speed on the default ladder: ``python -m bench features [--runs DIR]``.

Uses ``data/runs/<rung>-42`` (or the older ``data/runs/<rung>``) when all five default rungs exist there (and, unless
``--weights-only``, ``<corpus>/val.u8``), otherwise writes 255 synthetic checkpoints (51 per
rung, GPT-2 random init with a different seed per step) and a random ``val.u8`` into a
temporary directory. Measures (1) the weight-space features (NP, shuffled NP, Vietoris-Rips of
rows, spectral baselines) of all 255 checkpoints in a pool of ``--workers`` processes and (2)
the whole :func:`topometrics.features.run_shards.run_shards` per rung (weights, gradients,
representation topology, distances, written as shards into the temporary directory). Ends with one
JSON line, whose ``data`` says which checkpoints were measured (``real`` or ``synthetic``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from topometrics.execution.compute import map_jobs
from topometrics.features.checkpoint import weight_features
from topometrics.features.run_shards import read_tables, run_shards
from topometrics.models.checkpoints import list_checkpoints, load_state, save_checkpoint
from topometrics.models.model import GPT, GPTConfig, linear_weights
from topometrics.params import FeaturesParams, run_name

LADDER = {"tiny": (8, 1), "small": (16, 1), "medium": (24, 2), "large": (32, 3), "xl": (48, 3)}
STEPS = range(0, 5001, 100)


def synthetic_runs(root: Path) -> tuple[Path, Path]:
    corpus = root / "corpus"
    corpus.mkdir(parents=True)
    np.random.default_rng(0).integers(0, 128, 200_000).astype(np.uint8).tofile(corpus / "val.u8")
    for rung, (hidden, layers) in LADDER.items():
        config = GPTConfig(hidden=hidden, layers=layers, heads=4)
        run = root / "runs" / rung
        run.mkdir(parents=True)
        for step in STEPS:
            model = GPT(config)
            model.init_weights(torch.Generator().manual_seed(step))
            meta = {
                "step": step,
                "rung": rung,
                "seed": 42,
                "config": config.to_dict(),
                "recipe_fingerprint": "bench",
                "val_loss": float("nan"),
                "train_loss": float("nan"),
            }
            save_checkpoint(run, model, meta)
    return root / "runs", corpus


def run_dir(runs: Path, rung: str) -> Path:
    """The default seed's run of ``rung``: ``<runs>/<rung>-42``, else a run dir from before train.seeds."""
    named = runs / run_name(rung, 42)
    return named if named.exists() else runs / rung


def _weights_job(job: tuple[Path, int, FeaturesParams]):
    path, layers, params = job
    return weight_features(linear_weights(load_state(path), layers), params)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench features")
    parser.add_argument("--runs", type=Path, default=Path("data/runs"))
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--weights-only", action="store_true", help="skip the whole-stage measurement")
    args = parser.parse_args(argv)
    params = FeaturesParams(workers=args.workers)
    with tempfile.TemporaryDirectory() as tmp:
        runs, corpus = args.runs, args.corpus
        dirs = {rung: run_dir(runs, rung) for rung in LADDER}
        # The weight features need no corpus: --weights-only measures a real ladder without one.
        need_corpus = not args.weights_only
        if not all(list_checkpoints(d) for d in dirs.values()) or (need_corpus and not (corpus / "val.u8").exists()):
            print("no complete data/runs ladder: writing 255 synthetic checkpoints")
            runs, corpus = synthetic_runs(Path(tmp))
            dirs = {rung: runs / rung for rung in LADDER}
            data = "synthetic"
        else:
            data = "real"
        ckpts = [(c.path, c.config.layers, params) for d in dirs.values() for c in list_checkpoints(d)]
        start = time.perf_counter()
        map_jobs(_weights_job, ckpts, workers=params.workers, label="weights")
        weights_s = time.perf_counter() - start
        print(f"weight features, {len(ckpts)} checkpoints: {weights_s:.1f} s")
        if args.weights_only:
            print(json.dumps({"weight_features_s_255": round(weights_s, 2), "checkpoints": len(ckpts), "data": data}))
            return 0
        start = time.perf_counter()
        for rung in LADDER:
            t0 = time.perf_counter()
            run_shards(dirs[rung], corpus, params, Path(tmp) / "shards" / rung)
            features, diagrams = read_tables(Path(tmp) / "shards" / rung)
            print(f"features@{rung}: {time.perf_counter() - t0:.1f} s, {len(features)} rows, {len(diagrams)} bars")
        stage_s = time.perf_counter() - start
        print(f"whole features, {len(ckpts)} checkpoints: {stage_s:.1f} s")
    print(
        json.dumps(
            {
                "weight_features_s_255": round(weights_s, 2),
                "features_stage_s_255": round(stage_s, 2),
                "checkpoints": len(ckpts),
                "workers": params.workers,
                "data": data,
            }
        )
    )
    return 0
