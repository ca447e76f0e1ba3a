"""Training: schedule, checkpoints that describe themselves, bit-exact resume after kill -9,
stale-recipe protection and divergence handling."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from topometrics.checkpoints import CheckpointError, list_checkpoints, load_model, load_state
from topometrics.corpus import offline_text
from topometrics.model import GPTConfig
from topometrics.tokens import encode
from topometrics.train import Recipe, RungConfig, train_rung, validation_windows

TEXT = encode(offline_text()[:200_000])
TRAIN, VAL = TEXT[:180_000], TEXT[180_000:]


def config(steps=40, ckpt_every=10, lr=3e-3, seed=7) -> RungConfig:
    recipe = Recipe(steps, ckpt_every, 8, lr, 5, 0.0, 0.01, 1.0, seed, 8)
    return RungConfig("t", GPTConfig(hidden=8, layers=1, heads=1, context=32), recipe)


def quiet(*_):
    pass


def test_validation_windows_are_fixed_and_cover_the_split():
    x1, y1 = validation_windows(VAL, 8, 32)
    x2, _ = validation_windows(VAL, 8, 32)
    assert torch.equal(x1, x2) and x1.shape == (8, 32)
    assert torch.equal(x1[:, 1:], y1[:, :-1])
    assert x1[-1, -1].item() == VAL[-2]


def test_checkpoints_describe_themselves_and_loss_falls(tmp_path):
    torch.set_num_threads(1)
    summary = train_rung(config(), TRAIN, VAL, tmp_path, "sha", "cpu", quiet)
    ckpts = list_checkpoints(tmp_path)
    assert [c.step for c in ckpts] == [0, 10, 20, 30, 40] and summary["checkpoints"] == 5
    assert summary["status"] == "complete" and summary["n_params"] == 2_936 - 96 * 8  # context 32, not 128
    assert ckpts[-1].meta["val_loss"] < ckpts[0].meta["val_loss"]
    model = load_model(ckpts[-1])  # from the checkpoint alone
    assert model.cfg == GPTConfig(hidden=8, layers=1, heads=1, context=32)
    steps = np.loadtxt(tmp_path / "steps.csv", delimiter=",", skiprows=1)
    assert steps[:, 0].tolist() == list(range(1, 41)) and (steps[:, 2] > 0).all()
    assert not any(p.suffix in (".pt", ".pkl", ".pth") for p in tmp_path.iterdir())


RUNNER = """
import sys, torch
sys.path.insert(0, {tests!r})
torch.set_num_threads(1)
from test_train import TRAIN, VAL, config, quiet
from topometrics.train import train_rung
train_rung(config(steps=400, ckpt_every=20), TRAIN, VAL, __import__('pathlib').Path({out!r}), "sha", "cpu", quiet)
"""


def test_kill_9_then_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path):
    torch.set_num_threads(1)
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    code = RUNNER.format(tests=str(Path(__file__).parent), out=str(killed))
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.time() + 60
    while not (killed / "step_000060.json").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = [c.step for c in list_checkpoints(killed)]
    assert 60 <= max(done) < 400, f"the run was not interrupted mid-way: {done}"

    train_rung(config(steps=400, ckpt_every=20), TRAIN, VAL, killed, "sha", "cpu", quiet)
    train_rung(config(steps=400, ckpt_every=20), TRAIN, VAL, clean, "sha", "cpu", quiet)
    a, b = load_file(str(killed / "step_000400.safetensors")), load_file(str(clean / "step_000400.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in b)
    assert (killed / "steps.csv").read_text() == (clean / "steps.csv").read_text()


def test_a_changed_recipe_never_resumes_from_stale_checkpoints(tmp_path):
    torch.set_num_threads(1)
    train_rung(config(steps=20), TRAIN, VAL, tmp_path, "sha", "cpu", quiet)
    old = list_checkpoints(tmp_path)[0].meta["recipe_fingerprint"]
    train_rung(config(steps=20, seed=8), TRAIN, VAL, tmp_path, "sha", "cpu", quiet)
    ckpts = list_checkpoints(tmp_path)
    assert {c.meta["recipe_fingerprint"] for c in ckpts} != {old}
    assert len({c.meta["recipe_fingerprint"] for c in ckpts}) == 1 and len(ckpts) == 3
    train_rung(config(steps=20, seed=8), TRAIN, VAL, tmp_path, "another-corpus", "cpu", quiet)
    assert len({c.meta["recipe_fingerprint"] for c in list_checkpoints(tmp_path)}) == 1


def test_a_nan_loss_stops_the_rung_and_keeps_its_checkpoints(tmp_path):
    torch.set_num_threads(1)
    summary = train_rung(config(steps=40, ckpt_every=1, lr=float("inf")), TRAIN, VAL, tmp_path, "s", "cpu", quiet)
    assert summary["status"].startswith("diverged: loss is nan at step")
    assert 1 <= len(list_checkpoints(tmp_path)) < 41


def test_a_truncated_checkpoint_gives_an_error_naming_the_file(tmp_path):
    torch.set_num_threads(1)
    train_rung(config(steps=10), TRAIN, VAL, tmp_path, "sha", "cpu", quiet)
    path = tmp_path / "step_000010.safetensors"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="step_000010.safetensors: not a readable safetensors file"):
        load_state(path)


def test_sidecar_matches_the_metrics_the_stage_reports(tmp_path):
    torch.set_num_threads(1)
    summary = train_rung(config(steps=10), TRAIN, VAL, tmp_path, "sha", "cpu", quiet)
    meta = json.loads((tmp_path / "step_000010.json").read_text())
    assert meta["val_loss"] == summary["final_val_loss"] and meta["step"] == 10
