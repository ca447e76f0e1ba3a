"""Training: schedule, checkpoints that describe themselves, bit-exact resume after kill -9,
stale-recipe protection and divergence handling."""

import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from tests.models.helpers import module_weights
from tests.repo_params import features_params
from tests.training.helpers import TRAIN, VAL, config, quiet
from topometrics.features.checkpoint import features_frame, weight_features
from topometrics.features.monitor import TopologyMonitor
from topometrics.models.checkpoints import (
    CheckpointError,
    list_checkpoints,
    load_model,
    load_state,
    safetensors_problem,
    verify_checkpoint,
)
from topometrics.models.model import GPTConfig
from topometrics.models.tokens import encode
from topometrics.params import ParamsError
from topometrics.training.corpus import CorpusError, offline_text
from topometrics.training.monitor_log import read_log
from topometrics.training.run_dir import resume_info
from topometrics.training.run_queue import is_complete
from topometrics.training.train import (
    Recipe,
    RunConfig,
    load_run_config,
    recipe_fingerprint,
    train_run,
    validation_windows,
    write_checkpoint_table,
)

ROOT = str(Path(__file__).resolve().parents[2])  # the repository: scripts run here import tests.<folder>.helpers

MONITOR_PARAMS = features_params(max_points=20, workers=1)


def test_validation_windows_are_fixed_and_cover_the_split():
    x1, y1 = validation_windows(VAL, 8, 32)
    x2, _ = validation_windows(VAL, 8, 32)
    assert torch.equal(x1, x2) and x1.shape == (8, 32)
    assert torch.equal(x1[:, 1:], y1[:, :-1])
    assert x1[-1, -1].item() == VAL[-2]


def test_checkpoints_describe_themselves_and_loss_falls(tmp_path):
    torch.set_num_threads(1)
    summary = train_run(config(), TRAIN, VAL, tmp_path, "sha", "cpu", quiet)
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
sys.path.insert(0, {repo!r})  # the repository, for tests.<folder>.helpers
torch.set_num_threads(1)
from tests.training.helpers import TRAIN, VAL, config, quiet
from topometrics.training.train import train_run
train_run(config(steps=400, ckpt_every=20), TRAIN, VAL, __import__('pathlib').Path({out!r}), "sha", "cpu", quiet)
"""


def test_kill_9_then_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path):
    torch.set_num_threads(1)
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    code = RUNNER.format(repo=ROOT, out=str(killed))
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.time() + 600  # only a guard against a hang: a loaded machine starts torch slowly
    while not (killed / "step_000060.json").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = [c.step for c in list_checkpoints(killed)]
    assert 60 <= max(done) < 400, f"the run was not interrupted mid-way: {done}"

    train_run(config(steps=400, ckpt_every=20), TRAIN, VAL, killed, "sha", "cpu", quiet)
    train_run(config(steps=400, ckpt_every=20), TRAIN, VAL, clean, "sha", "cpu", quiet)
    a, b = load_file(str(killed / "step_000400.safetensors")), load_file(str(clean / "step_000400.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in b)
    assert (killed / "steps.csv").read_text() == (clean / "steps.csv").read_text()


def test_a_run_directory_of_another_run_is_refused_and_left_untouched(tmp_path):
    torch.set_num_threads(1)
    train_run(config(steps=20), TRAIN, VAL, tmp_path, "sha", "cpu", quiet)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(CheckpointError) as err:
        train_run(config(steps=20, seed=8), TRAIN, VAL, tmp_path, "sha", "cpu", quiet)
    assert str(err.value) == (
        f"{tmp_path} holds the checkpoints of run t-7, not t-8; train t-8 into its own directory data/runs/t-8 "
        "(nothing was changed)"
    )
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def monitored(run_dir: Path, every: int = 5) -> TopologyMonitor:
    return TopologyMonitor(run_dir / "monitor", every, MONITOR_PARAMS, "t-live", 7, log=quiet)


def test_a_monitored_run_writes_the_same_bytes_and_the_monitor_sees_the_checkpoints_weights(tmp_path):
    torch.set_num_threads(1)
    plain, watched = tmp_path / "plain", tmp_path / "watched"
    train_run(config(steps=20), TRAIN, VAL, plain, "sha", "cpu", quiet)
    with monitored(watched) as monitor:
        summary = train_run(config(steps=20), TRAIN, VAL, watched, "sha", "cpu", quiet, observers=[monitor])
    assert summary["status"] == "complete" and monitor.skipped == []
    written = sorted(p.name for p in plain.iterdir() if p.is_file() and p.name != "resume.safetensors")
    assert "step_000020.safetensors" in written and "steps.csv" in written
    for name in written:  # checkpoints, sidecars, step log, run record
        assert (watched / name).read_bytes() == (plain / name).read_bytes(), name
    # the resume state's metadata keys come out in any order (even between two plain runs): same tensors, same record
    a, b = load_file(str(watched / "resume.safetensors")), load_file(str(plain / "resume.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in b)
    assert resume_info(watched) == resume_info(plain)
    features, losses = read_log(watched / "monitor")
    assert sorted(features["step"].unique()) == [0, 5, 10, 15, 20]
    for ckpt in list_checkpoints(plain):  # the weights after step s are the ones its checkpoint holds
        want = features_frame(weight_features(module_weights(load_model(ckpt)), MONITOR_PARAMS), "t-live", 7, ckpt.step)
        got = features[features["step"] == ckpt.step].reset_index(drop=True)
        pd.testing.assert_frame_equal(got, want, check_dtype=False)
    losses = losses.set_index("step")
    assert [losses.loc[c.step, "val_loss"] for c in list_checkpoints(plain)] == [
        c.meta["val_loss"] for c in list_checkpoints(plain)
    ]  # the validation loss of every checkpoint; between checkpoints none
    assert losses.loc[[5, 15], "val_loss"].isna().all()
    logged = np.loadtxt(plain / "steps.csv", delimiter=",", skiprows=1)  # step, train loss (6 decimals), ...
    for step in (5, 10, 15, 20):
        assert losses.loc[step, "train_loss"] == pytest.approx(logged[step - 1, 1], abs=1e-6)


def test_a_changed_recipe_discards_the_monitor_log_and_another_runs_directory_gets_none(tmp_path):
    torch.set_num_threads(1)
    with monitored(tmp_path, every=10) as monitor:
        train_run(config(steps=20), TRAIN, VAL, tmp_path, "sha", "cpu", quiet, observers=[monitor])
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(CheckpointError, match="holds the checkpoints of run t-7, not t-8"), monitored(tmp_path) as m:
        train_run(config(steps=20, seed=8), TRAIN, VAL, tmp_path, "sha", "cpu", quiet, observers=[m])
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before  # its log included
    (tmp_path / "monitor" / "notes.txt").write_text("a file the run did not write")
    train_run(config(steps=40, lr=1e-3), TRAIN, VAL, tmp_path, "sha", "cpu", quiet)  # unmonitored, new recipe
    assert sorted(p.name for p in (tmp_path / "monitor").iterdir()) == ["notes.txt"]  # no stale measurement


def test_a_corpus_shorter_than_a_window_is_refused_before_the_run_directory_is_touched(tmp_path):
    torch.set_num_threads(1)
    train_run(config(steps=20), TRAIN, VAL, tmp_path, "sha", "cpu", quiet)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(CorpusError, match=r"gives 180,000 training and 20 validation characters; each split"):
        train_run(config(steps=20), TRAIN, VAL[:20], tmp_path, "other-corpus", "cpu", quiet)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def flip_bit(path: Path, from_end: int = 1) -> None:
    """Flip the lowest bit of one byte ``from_end`` bytes before the end of ``path`` (inside the last tensor)."""
    data = bytearray(path.read_bytes())
    data[-from_end] ^= 1
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["truncate", "delete", "sidecar", "flip"])
def test_a_damaged_checkpoint_of_a_finished_run_is_recomputed_identically(tmp_path, damage):
    torch.set_num_threads(1)
    train_run(config(steps=30), TRAIN, VAL, tmp_path, "sha", "cpu", quiet)
    good = {p.name: p.read_bytes() for p in tmp_path.glob("step_*")}
    target = tmp_path / "step_000010.safetensors"
    if damage == "truncate":
        target.write_bytes(target.read_bytes()[:100])
    elif damage == "delete":
        target.unlink()
    elif damage == "sidecar":
        target.with_suffix(".json").write_text("{")
    else:  # header and size intact: only the content hash sees it
        flip_bit(target)
        assert safetensors_problem(target) is None
    lines = []
    summary = train_run(config(steps=30), TRAIN, VAL, tmp_path, "sha", "cpu", lines.append)
    assert summary["status"] == "complete" and summary["checkpoints"] == 4
    assert {p.name: p.read_bytes() for p in tmp_path.glob("step_*")} == good
    named = {"truncate": "step_000010.safetensors: truncated", "delete": "step_000010.safetensors: missing",
             "sidecar": "step_000010.json: not valid JSON",
             "flip": "step_000010.safetensors: content changed after it was written (sha256 "}[damage]  # fmt: skip
    assert any(named in line and "recomputing from step 0" in line for line in lines), lines


@pytest.mark.parametrize("copied", ["another run's, over its own", "another run's, past its last step",
                                    "its own, of another recipe"])  # fmt: skip
def test_a_checkpoint_copied_in_from_another_run_is_named_not_complete_and_recomputed_identically(tmp_path, copied):
    """`cp small-42/step_000040.* tiny-42/`: whole and matching its own sidecar's hash, the copy was accepted
    as the run's checkpoint; its sidecar's run, recipe and step must be the run directory's."""
    torch.set_num_threads(1)
    run, other = tmp_path / "t-7", tmp_path / "other"
    train_run(config(steps=30), TRAIN, VAL, run, "sha", "cpu", quiet)
    write_checkpoint_table(run, run / "checkpoints.csv")  # as the queue marks a run complete
    assert is_complete(config(steps=30), run, "sha")
    good = {p.name: p.read_bytes() for p in run.glob("step_*")}
    source, step, named = {
        "another run's, over its own": (config(steps=30, seed=8), 10, "a checkpoint of run t-8, not of this run t-7"),
        "another run's, past its last step": (config(seed=8), 40, "a checkpoint of run t-8, not of this run t-7"),
        "its own, of another recipe": (config(steps=30, lr=1e-3), 10, "a checkpoint of run t-7 made with another "),
    }[copied]
    train_run(source, TRAIN, VAL, other, "sha", "cpu", quiet)
    for suffix in (".safetensors", ".json"):
        shutil.copy(other / f"step_{step:06d}{suffix}", run)
    assert not is_complete(config(steps=30), run, "sha")
    lines = []
    summary = train_run(config(steps=30), TRAIN, VAL, run, "sha", "cpu", lines.append)
    assert summary["status"] == "complete" and summary["checkpoints"] == 4
    assert {p.name: p.read_bytes() for p in run.glob("step_*")} == good  # the copy gone, its step recomputed
    line = next(line for line in lines if "recomputing from step 0" in line)
    assert f"step_{step:06d}.json: {named}" in line and "; delete it (the train stage recomputes" in line, line
    assert is_complete(config(steps=30), run, "sha")


def test_sidecars_record_the_weights_sha256_and_one_written_before_hashes_is_recorded_not_retrained(tmp_path):
    torch.set_num_threads(1)
    train_run(config(steps=20), TRAIN, VAL, tmp_path, "sha", "cpu", quiet)
    for ckpt in list_checkpoints(tmp_path):
        assert ckpt.meta["sha256"] == hashlib.sha256(ckpt.path.read_bytes()).hexdigest()
    legacy = {}
    for sidecar in tmp_path.glob("step_*.json"):  # as an older version wrote them
        meta = json.loads(sidecar.read_text())
        legacy[sidecar.name] = meta.pop("sha256")
        sidecar.write_text(json.dumps(meta))
    weights = {p.name: p.read_bytes() for p in tmp_path.glob("step_*.safetensors")}
    lines = []
    train_run(config(steps=20), TRAIN, VAL, tmp_path, "sha", "cpu", lines.append)
    assert lines == [f"[t-7] complete: all 3 checkpoints whole ({tmp_path})"]  # verified, not retrained
    assert {p.name: p.read_bytes() for p in tmp_path.glob("step_*.safetensors")} == weights
    assert {p.name: json.loads(p.read_text())["sha256"] for p in tmp_path.glob("step_*.json")} == legacy
    flip_bit(tmp_path / "step_000020.safetensors")  # from now on a change is caught
    assert "step_000020.safetensors: content changed" in verify_checkpoint(tmp_path, 20)


def test_a_complete_run_is_skipped_after_its_checkpoints_are_verified(tmp_path):
    torch.set_num_threads(1)
    train_run(config(steps=20), TRAIN, VAL, tmp_path, "sha", "cpu", quiet)
    (tmp_path / "resume.safetensors").write_bytes(b"")  # not needed to skip a complete run
    lines = []
    summary = train_run(config(steps=20), TRAIN, VAL, tmp_path, "sha", "cpu", lines.append)
    assert summary["status"] == "complete" and summary["tokens_per_s"] is None
    assert lines == [f"[t-7] complete: all 3 checkpoints whole ({tmp_path})"]
    extended = tmp_path / "step_000020.safetensors"
    extended.write_bytes(extended.read_bytes() + b"\0")
    assert safetensors_problem(extended).startswith("longer than its tensors")


def test_a_changed_recipe_never_resumes_from_stale_checkpoints(tmp_path):
    torch.set_num_threads(1)
    train_run(config(steps=20), TRAIN, VAL, tmp_path, "sha", "cpu", quiet)
    old = list_checkpoints(tmp_path)[0].meta["recipe_fingerprint"]
    (tmp_path / "notes.txt").write_text("a file the run did not write")
    train_run(config(steps=20, lr=1e-3), TRAIN, VAL, tmp_path, "sha", "cpu", quiet)
    assert (tmp_path / "notes.txt").exists()  # only the run's own files are discarded
    ckpts = list_checkpoints(tmp_path)
    assert {c.meta["recipe_fingerprint"] for c in ckpts} != {old}
    assert len({c.meta["recipe_fingerprint"] for c in ckpts}) == 1 and len(ckpts) == 3
    train_run(config(steps=20, lr=1e-3), TRAIN, VAL, tmp_path, "another-corpus", "cpu", quiet)
    assert len({c.meta["recipe_fingerprint"] for c in list_checkpoints(tmp_path)}) == 1


def test_a_nan_loss_stops_the_rung_and_keeps_its_checkpoints(tmp_path):
    torch.set_num_threads(1)
    summary = train_run(config(steps=40, ckpt_every=1, lr=float("inf")), TRAIN, VAL, tmp_path, "s", "cpu", quiet)
    assert summary["status"].startswith("diverged: loss is nan at step")
    assert 1 <= len(list_checkpoints(tmp_path)) < 41
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["status"] == "diverged" and record["reason"].startswith("loss is nan at step")


def test_a_truncated_checkpoint_gives_an_error_naming_the_file(tmp_path):
    torch.set_num_threads(1)
    train_run(config(steps=10), TRAIN, VAL, tmp_path, "sha", "cpu", quiet)
    path = tmp_path / "step_000010.safetensors"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="step_000010.safetensors: not a readable safetensors file"):
        load_state(path)


def test_sidecar_matches_the_metrics_the_stage_reports(tmp_path):
    torch.set_num_threads(1)
    summary = train_run(config(steps=10), TRAIN, VAL, tmp_path, "sha", "cpu", quiet)
    meta = json.loads((tmp_path / "step_000010.json").read_text())
    assert meta["val_loss"] == summary["final_val_loss"] and meta["step"] == 10


@pytest.mark.slow
def test_dvc_repro_recomputes_a_truncated_and_a_deleted_checkpoint_of_a_finished_run(reproduced):
    """Truncate one checkpoint and delete another (what an earlier message told users to do): the
    next `dvc repro` names them, recomputes both bit-identically, and the warehouse has every step."""
    import duckdb

    from tests.pipeline.helpers import run

    run_dir = reproduced / "data/runs/a-42"
    good = {p.name: p.read_bytes() for p in run_dir.glob("step_*")}
    truncated = run_dir / "step_000020.safetensors"
    truncated.write_bytes(truncated.read_bytes()[:100])
    (run_dir / "step_000040.safetensors").unlink()
    (run_dir / "step_000040.json").unlink()
    out = run(["dvc", "repro"], reproduced)
    assert "damaged or missing: step_000020.safetensors: truncated" in out
    assert "step_000040.json: missing" in out and "recomputing from step 0" in out
    assert {p.name: p.read_bytes() for p in run_dir.glob("step_*")} == good
    with duckdb.connect(str(reproduced / "data/warehouse.duckdb"), read_only=True) as con:
        steps = con.execute("SELECT list(DISTINCT step ORDER BY step) FROM features WHERE rung = 'a'").fetchone()[0]
    assert steps == [0, 10, 20, 30, 40]


@pytest.mark.slow
def test_train_stage_by_hand_with_another_runs_directory_is_refused_in_one_line(reproduced):
    """A config that names run a-7 where a-42's belongs: training it into data/runs/a-42 is refused."""
    from tests.pipeline.helpers import dvc_env, error_lines, snapshot

    other = json.loads((reproduced / "data/config/a-42.json").read_text()) | {"seed": 7}
    other["recipe"]["seed"] = 7
    (reproduced / "wrong").mkdir()
    (reproduced / "wrong/a-42.json").write_text(json.dumps(other))
    before = snapshot(reproduced / "data/runs")
    cmd = [sys.executable, "stages/train.py", "--configs", "wrong", "--corpus", "data/corpus", "--runs", "data/runs"]
    proc = subprocess.run([*cmd, "--metrics", "m", "--curves", "c"], cwd=reproduced, env=dvc_env(),
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 1
    assert (
        error_lines(proc.stderr)
        == proc.stderr.splitlines()
        == [
            "error: a-7: data/runs/a-42 holds the checkpoints of run a-42, not a-7; train a-7 into its own "
            "directory data/runs/a-7 (nothing was changed)"
        ]
    )
    assert snapshot(reproduced / "data/runs") == before


def test_a_config_file_that_is_not_the_config_stages_is_named_with_the_fix(tmp_path):
    path = tmp_path / "t-7.json"
    with pytest.raises(ParamsError, match=r"t-7.json not found; run `dvc repro config` first$"):
        load_run_config(path)
    written = config().to_dict()
    path.write_text(json.dumps(written))
    assert load_run_config(path) == config()
    path.write_text(json.dumps({k: v for k, v in written.items() if k != "variant"}))  # no layout without it
    with pytest.raises(ParamsError, match=r"t-7.json is not a run config \(KeyError: 'variant'\); regenerate it: dvc"):
        load_run_config(path)


def test_a_wsd_recipe_trains_with_its_schedule_and_a_new_fingerprint(tmp_path):
    torch.set_num_threads(1)
    cfg = config(steps=20)
    cfg = dataclasses.replace(cfg, recipe=dataclasses.replace(cfg.recipe, schedule="wsd", decay_fraction=0.25))
    assert RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg  # the config file round-trips
    train_run(cfg, TRAIN, VAL, tmp_path, "sha", "cpu", quiet)
    logged = pd.read_csv(tmp_path / "steps.csv")["lr"].to_numpy()
    expected = 3e-3 * np.r_[np.arange(1, 6) / 5, np.ones(10), (1 - np.arange(1, 6) / 5)]  # warm-up, stable, linear
    np.testing.assert_allclose(logged, expected, rtol=1e-7, atol=1e-12)
    plain = config(steps=20)
    assert recipe_fingerprint(cfg, "sha") != recipe_fingerprint(plain, "sha")
    assert "schedule" not in plain.to_dict()["recipe"]


def test_a_character_run_keeps_the_fingerprint_and_checkpoint_bytes_it_had_before_tokenizers_were_a_param(tmp_path):
    """Known answer: the recipe fingerprint and the initial checkpoint's sha256 that the code before
    ``data.tokenizer`` gave this run (the same config, corpus slice and seed), and where its training took the
    weights. The trained checkpoints' bytes depend on the CPU's float kernels (two CI machines gave two sets for the
    same code), so the trained steps are pinned by how far each moved from step 0 — the sum, the squared norm and
    a seeded projection of the change — and the validation loss, to 1e-4 relative: one or two threads move them by
    ~1e-6, any change to the data order, the schedule or the update by far more."""
    cfg = RunConfig(
        "t",
        GPTConfig(hidden=8, layers=1, heads=1, context=16),
        Recipe(steps=4, ckpt_every=2, batch_size=4, lr=3e-3, warmup=1, min_lr_ratio=0.0, weight_decay=0.01,
               grad_clip=1.0, seed=7, val_windows=4),
    )  # fmt: skip
    assert recipe_fingerprint(cfg, "abc") == recipe_fingerprint(cfg, "abc", None) == "279c4fdf7e0d919f"
    assert recipe_fingerprint(cfg, "abc", "f" * 64) != "279c4fdf7e0d919f"  # a BPE is part of the recipe
    ids = encode(offline_text()[:20_000])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_run(cfg, ids[:18_000], ids[18_000:], tmp_path, "abc", "cpu", log=quiet, progress_bar=False)
    finally:
        torch.set_num_threads(threads)
    first = tmp_path / "step_000000.safetensors"
    assert hashlib.sha256(first.read_bytes()).hexdigest()[:16] == "a7417c0927bd582a"

    def flat(step: int) -> np.ndarray:
        weights = load_file(str(tmp_path / f"step_{step:06d}.safetensors"))
        return np.concatenate([weights[k].double().numpy().ravel() for k in sorted(weights)])

    start = flat(0)
    direction = np.random.default_rng(0).standard_normal(start.size)
    known = {  # step: sum, squared norm and projection of the change since step 0, validation loss (nats)
        2: (0.130488024, 0.0376640901, -0.0479738938, 4.830235481),
        4: (0.253377828, 0.0457341017, -0.0328221412, 4.824689865),
    }
    for step, want in known.items():
        change = flat(step) - start
        sidecar = json.loads((tmp_path / f"step_{step:06d}.json").read_text())
        got = (change.sum(), change @ change, change @ direction, sidecar["val_loss"])
        np.testing.assert_allclose(got, want, rtol=1e-4, err_msg=f"step {step}")
    assert "tokenizer" not in json.loads((tmp_path / "step_000004.json").read_text())


def test_the_sidecars_bits_per_byte_is_the_summed_cross_entropy_over_the_bytes_of_the_scored_text(tmp_path):
    """Direct computation: sum over every scored target of -log2 p(target), over the UTF-8 bytes of the text the
    targets stand for (ASCII here: one byte per character, unknown ids at the validation text's mean)."""
    from topometrics.models.tokens import token_bytes

    ascii_text = "".join(c for c in offline_text()[180_000:200_000] if ord(c) < 127)
    val_text = ascii_text + "é世" * 300  # 600 unknown ids of 2 and 3 bytes: mean 2.5
    val = encode(val_text)
    record = {"val_bytes": len(val_text.encode("utf-8"))}
    lengths = token_bytes(tmp_path, record, val)
    assert lengths[127] == pytest.approx(2.5) and (lengths[:127] == 1).all()
    cfg = config(steps=20)
    train_run(cfg, TRAIN, val, tmp_path / "run", "x", "cpu", log=quiet, progress_bar=False, token_bytes=lengths)
    meta = json.loads((tmp_path / "run" / "step_000020.json").read_text())
    x, y = validation_windows(val, cfg.recipe.val_windows, 32)
    model = load_model(list_checkpoints(tmp_path / "run")[-1])
    with torch.no_grad():
        logits = model(x)
        nats = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum")
    targets = y.numpy().ravel()
    n_bytes = np.count_nonzero(targets < 127) + 2.5 * np.count_nonzero(targets == 127)
    assert meta["val_tokens"] == targets.size and meta["val_bytes"] == pytest.approx(n_bytes)
    assert meta["val_bpb"] == pytest.approx(nats.item() / np.log(2) / n_bytes, rel=1e-5)
    write_checkpoint_table(tmp_path / "run", tmp_path / "checkpoints.csv")
    last = pd.read_csv(tmp_path / "checkpoints.csv").iloc[-1]
    assert last["val_bpb"] == pytest.approx(meta["val_bpb"], abs=1e-6)
