"""Helpers shared by the features tests: a tiny run directory and the features stage on it, its shards read back,
a few training steps, a Hugging Face callback that trains on one thread, and the comparison of a shared forward
pass with separate ones."""

import duckdb
import numpy as np
import pandas as pd
import pytest
import torch
from transformers import TrainerCallback

from tests.repo_params import features_params
from topometrics.execution.shards import params_digest, scan
from topometrics.features.run_shards import read_tables
from topometrics.features.sweep import run_shards
from topometrics.models.checkpoints import save_checkpoint
from topometrics.models.model import GPT, GPTConfig

CONFIG = GPTConfig(context=16, hidden=8, layers=2, heads=2)


PARAMS = features_params(
    rep_points=60, rep_batch=4, betti_scales=4, workers=1, landscape_grid=5, landscape_every=2, hessian_iters=8
)


def tiny_model(seed: int) -> GPT:
    model = GPT(CONFIG)
    model.init_weights(torch.Generator().manual_seed(seed))
    return model


def write_run(root, steps):
    (root / "run").mkdir()
    (root / "corpus").mkdir()
    np.random.default_rng(0).integers(0, 128, 500).astype(np.uint8).tofile(root / "corpus" / "val.u8")
    for step in steps:
        meta = {
            "step": step,
            "rung": "tiny",
            "seed": 42,
            "config": CONFIG.to_dict(),
            "recipe_fingerprint": "t",
            "val_loss": 4.0,
            "train_loss": 4.0,
        }
        save_checkpoint(root / "run", tiny_model(step), meta)


def stage_project(root, steps, features: dict) -> list[str]:
    """A folder the features stage runs in: one run ``runs/tiny-42`` (``write_run``), the corpus, and a
    params.yaml declaring only that run, with ``features`` overrides; returns the stage's command line."""
    import sys
    from pathlib import Path

    import yaml

    repo = Path(__file__).resolve().parents[2]
    write_run(root, steps)
    (root / "runs").mkdir()
    (root / "run").rename(root / "runs" / "tiny-42")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["features"] |= features
    params |= {"ladder": {"tiny": {}}, "variants": {}}
    params["train"]["seeds"] = [42]
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return [sys.executable, str(repo / "stages/features.py"), "--runs", "runs", "--corpus", "corpus", "--out", "out"]


def run_tables(run_dir, corpus, out, params=PARAMS):
    """The features (with the distances) and diagrams tables of a run: its shards in ``out``, read back."""
    run_shards(run_dir, corpus, params, out)
    return read_tables(out)


def train_steps(model, steps, seed=0):
    """A few real AdamW steps on random tokens, yielding (step, loss) after each update."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(seed)
    for step in range(1, steps + 1):
        x = torch.randint(0, 128, (4, 16), generator=gen)
        loss = model.loss(x[:, :-1], x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        yield step, loss.item()


class OneThread(TrainerCallback):
    """A 32-wide model on one torch thread: more only contend (14x slower on a busy 2-core box).
    Set when training starts, after the Trainer has set torch up."""

    def on_train_begin(self, args, state, control, **kwargs):
        torch.set_num_threads(1)


STEPS = (0, 100, 200, 300)


def read_back(root):
    """features (+ distances) and diagrams of every shard under root, as the warehouse reads them."""
    con = duckdb.connect()
    digest = params_digest(PARAMS)
    features = pd.concat(
        [con.execute(f"SELECT * FROM {scan(con, root, t, digest).relation()}").df() for t in ("features", "distances")]
    )
    diagrams = con.execute(f"SELECT * FROM {scan(con, root, 'diagrams', digest).relation()}").df()
    return features, diagrams


def same_rows(a: pd.DataFrame, b: pd.DataFrame, keys: list[str]) -> None:
    a = a[b.columns].sort_values(keys).reset_index(drop=True)
    b = b.sort_values(keys).reset_index(drop=True)
    if "reason" in b:  # NULL: None from DuckDB, NaN from pandas
        a["reason"], b["reason"] = a["reason"].fillna("-"), b["reason"].fillna("-")
    pd.testing.assert_frame_equal(a, b, check_dtype=False)


def assert_shared_pass_equals_separate(shared, apart, shared_rows, apart_rows) -> None:
    """One pass for the forward features and the gradient clouds (``shared``: a ForwardPass and its
    ``gradient_rows``) gives the separate passes' numbers: the loss, norms and states bit for bit, the clouds
    within float32 rounding."""
    assert shared.gradients.found is not None and apart.gradients.found is None
    assert shared.loss == apart.loss and shared.grad_norms == apart.grad_norms
    assert np.array_equal(shared.states, apart.states)
    for (layer, values, reason), (other, expected, why) in zip(shared_rows, apart_rows, strict=True):
        assert (layer, reason) == (other, why) and reason is None
        assert values == pytest.approx(expected, rel=1e-5, abs=1e-7), layer
