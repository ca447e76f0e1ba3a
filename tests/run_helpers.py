"""Helpers shared by the tests that train small runs (the run queue, a Dask cluster, SLURM): a run's config, a
prepared corpus from the offline text, a run's output paths, and a free loopback port."""

import json
import socket
from pathlib import Path

from topometrics.models.model import GPTConfig
from topometrics.models.tokens import encode
from topometrics.training.corpus import offline_text
from topometrics.training.run_queue import RunFiles
from topometrics.training.train import Recipe, RunConfig


def config(rung="t", seed=7, steps=40, lr=3e-3, hidden=8, layers=1, variant="base") -> RunConfig:
    """A tiny run: a checkpoint every 20 steps (every 10 when ``steps`` is not a multiple of 20)."""
    recipe = Recipe(steps, 10 if steps % 20 else 20, 8, lr, 5, 0.0, 0.01, 1.0, seed, 8)
    return RunConfig(rung, GPTConfig(hidden=hidden, layers=layers, heads=1, context=32), recipe, variant)


def corpus(root: Path) -> Path:
    """A prepared corpus directory (what the corpus stage writes) from the offline text."""
    root.mkdir(parents=True, exist_ok=True)
    text = encode(offline_text()[:200_000])
    text[:180_000].tofile(root / "train.u8")
    text[180_000:].tofile(root / "val.u8")
    (root / "source.json").write_text(json.dumps({"sha256": "test", "used": "python-docs-offline"}))
    return root


def files(root: Path, cfg: RunConfig) -> RunFiles:
    name = cfg.name
    return RunFiles(cfg, root / "runs" / name, root / "metrics" / f"{name}.json", root / "curves" / f"{name}.csv")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
