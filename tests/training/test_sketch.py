"""The trajectory sketch: the projection it records, checkpoints unchanged by it, no gap or duplicate after kill -9."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from tests.repo_params import features_params, train_params
from tests.training.helpers import TRAIN, VAL, config, quiet
from topometrics.measures.projection import PROJECTION, project
from topometrics.models.checkpoints import list_checkpoints, load_model
from topometrics.models.model import GPT, GPTConfig
from topometrics.training.run_dir import resume_info
from topometrics.training.sketch import (
    SKETCH_FILE,
    SKETCH_META,
    SketchRecorder,
    TrajectorySketches,
    read_sketch,
    sketch,
)
from topometrics.training.train import train_run

ROOT = str(Path(__file__).resolve().parents[2])  # the repository: scripts run here import tests.<folder>.helpers


def test_the_sketch_is_the_projection_of_the_flattened_parameters():
    model = GPT(GPTConfig(hidden=8, layers=1, heads=1, context=16))
    model.init_weights(torch.Generator().manual_seed(0))
    theta = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double().numpy()
    got = sketch(model, 16, seed=3)
    np.testing.assert_allclose(got, project(theta, 16, 3), rtol=1e-12, atol=1e-12)
    assert np.array_equal(got, sketch(model, 16, seed=3)) and not np.allclose(got, sketch(model, 16, seed=4))
    # the projection keeps the weights' norm to within the JL spread (chi^2_16 / 16: sd 0.35 of the squared norm)
    assert 0.3 < np.sum(got**2) / np.sum(theta**2) < 2.0


def test_checkpoints_are_byte_identical_with_and_without_the_sketch(tmp_path):
    torch.set_num_threads(1)
    plain, sketched = tmp_path / "plain", tmp_path / "sketched"
    train_run(config(), TRAIN, VAL, plain, "sha", "cpu", quiet)
    recorder = SketchRecorder(sketched, dim=8, every=5)
    train_run(config(), TRAIN, VAL, sketched, "sha", "cpu", quiet, observers=[recorder])
    recorder.close()
    files = sorted(p.name for p in plain.iterdir())
    assert sorted(p.name for p in sketched.iterdir()) == sorted([*files, SKETCH_FILE, SKETCH_META])
    assert "step_000040.safetensors" in files and "steps.csv" in files
    for name in set(files) - {"resume.safetensors"}:  # checkpoints, sidecars, step log, run record
        assert (plain / name).read_bytes() == (sketched / name).read_bytes(), name
    # the resume state's metadata keys come out in any order (even between two plain runs): same tensors, same record
    a, b = load_file(str(sketched / "resume.safetensors")), load_file(str(plain / "resume.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in b)
    assert resume_info(sketched) == resume_info(plain)
    steps, points = read_sketch(sketched)
    assert steps.tolist() == list(range(0, 41, 5)) and points.shape == (9, 8)
    for ckpt in list_checkpoints(sketched):  # each checkpoint's weights, sketched afresh, are the recorded row
        row = points[steps.tolist().index(ckpt.step)]
        np.testing.assert_array_equal(row, sketch(load_model(ckpt), recorder.dim, recorder.seed))


RUNNER = """
import sys, torch
sys.path.insert(0, {repo!r})  # the repository, for tests.<folder>.helpers
torch.set_num_threads(1)
from tests.training.helpers import TRAIN, VAL, config, quiet
from topometrics.training.run_dir import resume_info
from topometrics.training.sketch import SketchRecorder
from topometrics.training.train import train_run

out = __import__('pathlib').Path({out!r})
train_run(config(steps=400, ckpt_every=20), TRAIN, VAL, out, "sha", "cpu", quiet, observers=[SketchRecorder(out, 8, 3)])
"""


def test_a_resumed_run_continues_its_sketch_without_gap_or_duplicate_after_kill_9(tmp_path):
    torch.set_num_threads(1)
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    proc = subprocess.Popen([sys.executable, "-c", RUNNER.format(repo=ROOT, out=str(killed))])
    deadline = time.time() + 600  # only a guard against a hang
    try:
        while proc.poll() is None and time.time() < deadline:
            # freeze the run (our own child) to read a consistent state: kill it only once the sketch holds rows
            # past the last checkpoint, the rows the resumed run must rewrite rather than write twice
            os.kill(proc.pid, signal.SIGSTOP)
            done = [c.step for c in list_checkpoints(killed)]
            if done and max(done) >= 60 and read_sketch(killed)[0].max() > max(done):
                break
            os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.005)
    finally:
        proc.kill()
        proc.wait()
    done = [c.step for c in list_checkpoints(killed)]
    assert 60 <= max(done) < 400, f"the run was not interrupted mid-way: {done}"
    before, _ = read_sketch(killed)
    assert before.max() > max(done)  # rows beyond the resume point exist and are rewritten, not duplicated
    for out in (killed, clean):
        recorder = TrajectorySketches(8, 3)(None, out)
        train_run(config(steps=400, ckpt_every=20), TRAIN, VAL, out, "sha", "cpu", quiet, observers=[recorder])
        recorder.close()
    steps, _ = read_sketch(killed)
    assert steps.tolist() == list(range(0, 401, 3))
    assert (killed / SKETCH_FILE).read_text() == (clean / SKETCH_FILE).read_text()


def test_a_torn_last_row_and_rows_past_the_resume_step_are_dropped(tmp_path):
    model = GPT(GPTConfig(hidden=8, layers=1, heads=1, context=16))
    recorder = SketchRecorder(tmp_path, dim=4, every=10)
    for step in (0, 10, 20, 30):
        recorder.on_step(model, step, 1.0)
    recorder.close()
    with (tmp_path / SKETCH_FILE).open("a") as f:
        f.write("40,0.5,0.2")  # killed mid-row
    assert read_sketch(tmp_path)[0].tolist() == [0, 10, 20, 30]
    again = SketchRecorder(tmp_path, dim=4, every=10)
    again.on_step(model, 20, None)  # resumed from the checkpoint at step 20
    again.close()
    assert read_sketch(tmp_path)[0].tolist() == [0, 10, 20]
    other = SketchRecorder(tmp_path, dim=5, every=10)  # another dimension: the file starts over
    other.on_step(model, 30, None)
    other.close()
    steps, points = read_sketch(tmp_path)
    assert steps.tolist() == [30] and points.shape == (1, 5)
    meta = json.loads((tmp_path / SKETCH_META).read_text())
    assert meta["projection"] == PROJECTION
    del meta["projection"]  # a file from the Gaussian matrix's time names no projection: it starts over
    (tmp_path / SKETCH_META).write_text(json.dumps(meta) + "\n")
    older = SketchRecorder(tmp_path, dim=5, every=10)
    older.on_step(model, 40, None)
    older.close()
    assert read_sketch(tmp_path)[0].tolist() == [40]  # not [30, 40]


def test_no_sketch_reads_as_empty(tmp_path):
    steps, points = read_sketch(tmp_path)
    assert steps.shape == (0,) and points.shape == (0, 0)


def test_the_train_stage_sketches_every_run_by_default_and_not_when_switched_off():
    import dataclasses

    from stages.train import observers

    assert observers(train_params(), features_params()) == [TrajectorySketches(64, 10)]
    assert observers(dataclasses.replace(train_params(), sketch_every=0), features_params()) == []


def test_a_changed_recipe_discards_the_old_sketch_with_the_runs_other_files(tmp_path):
    from topometrics.training.run_dir import discard_stale

    model = GPT(GPTConfig(hidden=8, layers=1, heads=1, context=16))
    recorder = SketchRecorder(tmp_path, dim=4, every=10)
    recorder.on_step(model, 0, 1.0)
    recorder.close()
    (tmp_path / "notes.txt").write_text("the user's")
    discard_stale(tmp_path, "t-7", quiet)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
