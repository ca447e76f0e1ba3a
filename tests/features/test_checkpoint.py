"""topometrics.features.checkpoint: tables, diverged checkpoints and a tiny run directory (its shards read back)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import torch

from tests.features.helpers import CONFIG, PARAMS, run_tables, stage_project, tiny_model, write_run
from topometrics.features.checkpoint import (
    ALL,
    DIAGRAM_COLUMNS,
    FEATURE_COLUMNS,
    checkpoint_features,
    linear_and_forward_features,
    needs_forward,
)
from topometrics.features.distances import distance_features
from topometrics.features.forward import on_device, surface_batch, validation_batch
from topometrics.features.gradient_cloud import gradient_batch
from topometrics.measures.layer_features import OFF
from topometrics.models.model import linear_layer_names
from topometrics.params import ParamsError
from topometrics.vocabulary import CURVATURE, LANDSCAPE, model_only


def batch():
    tokens = np.random.default_rng(0).integers(0, 128, 200).astype(np.uint8)
    return validation_batch(tokens, CONFIG.context, PARAMS.rep_batch)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("features")
    write_run(root, (0, 100, 200))
    return run_tables(root / "run", root / "corpus", root / "shards")


def test_run_tables_have_the_public_columns_and_every_step(run):
    features, diagrams = run
    assert list(features.columns) == FEATURE_COLUMNS
    assert list(diagrams.columns) == DIAGRAM_COLUMNS
    assert sorted(features.step.unique()) == [0, 100, 200]
    assert set(features.layer) == {*linear_layer_names(2), ALL}
    assert set(diagrams.source) == {"weights", "representation"}
    assert np.isfinite(diagrams.death).all()  # the essential H0 bar is never stored
    assert not features.duplicated(["step", "layer", "feature"]).any()


def test_run_values_are_consistent(run):
    features, diagrams = run
    at = features.set_index(["step", "layer", "feature"]).value
    layers = linear_layer_names(2)
    assert at[(100, ALL, "vr_tp0")] == pytest.approx(sum(at[(100, name, "vr_tp0")] for name in layers))
    assert at[(100, ALL, "np_norm")] == pytest.approx(np.mean([at[(100, name, "np_norm")] for name in layers]))
    rep0 = diagrams.query("step == 100 and source == 'representation' and dim == 0")
    assert at[(100, ALL, "rep_tp0")] == pytest.approx((rep0.death - rep0.birth).sum())
    assert at[(100, ALL, "grad_norm")] > 0
    first = features[(features.step == 0) & features.feature.str.endswith("_prev")]
    assert first.value.isna().all() and first.reason.str.startswith("first checkpoint").all()
    later = features[(features.step == 200) & features.feature.str.endswith("_prev")]
    assert later.value.notna().all() and (later.value > 0).all()
    ok = features[features.reason.isna()]
    assert np.isfinite(ok.value).all()


def test_every_other_checkpoint_gets_the_loss_surface_and_the_others_say_why_not(run):
    features, _ = run
    surface = features[features.feature.str.startswith(("ls_", "hess_"))].set_index(["step", "feature"])
    names = model_only(LANDSCAPE) + model_only(CURVATURE)  # every declared loss-surface feature, at every step
    assert set(surface.reset_index().layer) == {ALL} and sorted(surface.reset_index().feature) == sorted(3 * names)
    assert surface.loc[100].value.isna().all()
    assert (surface.loc[100].reason == "not a loss-surface checkpoint (features.landscape_every = 2)").all()
    for step in (0, 200):  # the first checkpoint and every second one after it
        assert surface.loc[(step, "ls_rand_minima"), "value"] >= 1
        assert surface.loc[(step, "ls_rand_range"), "value"] > 0
        assert np.isfinite(surface.loc[(step, "hess_trace"), "value"])  # an estimate: at init it may be < 0
        at = surface.loc[step].value
        for pair in ("rand",):  # a bar's persistence is a loss difference inside the slice
            assert at[f"ls_{pair}_max_pers"] <= at[f"ls_{pair}_tp"] <= at[f"ls_{pair}_range"] * at[f"ls_{pair}_saddles"]
        done = surface.loc[step]
        assert (done.value.notna() | done.reason.str.startswith("Lanczos did not converge")).all()


def test_a_loss_surface_batch_larger_than_the_validation_split_is_null_with_the_reason():
    tokens = np.random.default_rng(0).integers(0, 128, 200).astype(np.uint8)
    params = dataclasses.replace(PARAMS, landscape_batch=20)
    reason = surface_batch(tokens, CONFIG.context, params, 0)
    assert reason == "features.landscape_batch = 20 windows of 16 need 321 validation tokens, the split has 200"
    rows = checkpoint_features(tiny_model(1).state_dict(), CONFIG, batch(), params, reason).rows
    surface = [r for r in rows if r[1].startswith(("ls_", "hess_"))]
    assert sorted(r[1] for r in surface) == sorted(model_only(LANDSCAPE) + model_only(CURVATURE))
    assert all(np.isnan(r[2]) and r[3] == reason for r in surface)
    x, y = surface_batch(tokens, CONFIG.context, PARAMS, 4)  # the same windows at every checkpoint
    assert torch.equal(x, batch()[0][: PARAMS.landscape_batch]) and torch.equal(y, batch()[1][: PARAMS.landscape_batch])


def test_families_switched_off_are_null_with_the_reason_and_leave_no_diagram():
    params = dataclasses.replace(PARAMS, families=("np", "spectral", "curvature"))
    tokens = np.random.default_rng(0).integers(0, 128, 200).astype(np.uint8)
    result = checkpoint_features(
        tiny_model(1).state_dict(), CONFIG, batch(), params, surface_batch(tokens, 16, params, 0)
    )
    by_name = {(layer, name): (value, reason) for layer, name, value, reason in result.rows}
    off = "family switched off (features.families)"
    for name in ("vr_tp0", "ls_rand_minima", "ls_hess_tp", "rep_tp0", "grad_norm", "w_alpha", "np_z"):
        assert np.isnan(by_name[(ALL, name)][0]) and by_name[(ALL, name)][1] == off, name
    for name in ("np_norm", "w_fro", "hess_trace"):
        assert np.isfinite(by_name[(ALL, name)][0]), name
    assert result.diagrams == {}


def test_diverged_checkpoint_gives_null_with_reason_and_a_warning(run):
    state = tiny_model(1).state_dict()
    state["blocks.0.mlp.up.weight"][0, 0] = float("nan")
    with pytest.warns(RuntimeWarning, match="diverged"):
        result = checkpoint_features(state, CONFIG, batch(), PARAMS)
    values = np.array([row[2] for row in result.rows])
    assert np.isnan(values).all() and all(row[3].startswith("diverged") for row in result.rows)
    healthy, _ = run
    expected = healthy[
        (healthy.step == 0) & ~healthy.feature.str.endswith("_prev") & ~healthy.feature.str.startswith("traj_")
    ]
    assert {(r[0], r[1]) for r in result.rows} == set(zip(expected.layer, expected.feature, strict=True))
    dist = distance_features(
        checkpoint_features(tiny_model(2).state_dict(), CONFIG, batch(), PARAMS), result, linear_layer_names(2)
    )
    assert all(np.isnan(r[2]) and "missing" in r[3] for r in dist.rows)


def test_features_are_deterministic():
    a = checkpoint_features(tiny_model(3).state_dict(), CONFIG, batch(), PARAMS)
    b = checkpoint_features(tiny_model(3).state_dict(), CONFIG, batch(), PARAMS)
    assert json.dumps(a.rows) == json.dumps(b.rows)


def test_the_device_setting_places_the_model_and_every_batch_and_a_missing_gpu_is_one_line():
    tokens = np.random.default_rng(0).integers(0, 128, 400).astype(np.uint8)
    batches = (surface_batch(tokens, 16, PARAMS, 0), gradient_batch(tokens, 16, PARAMS))
    rows = {
        device: checkpoint_features(
            tiny_model(3).state_dict(),
            CONFIG,
            batch(),
            dataclasses.replace(PARAMS, device=device),
            *batches[:1],
            gradients=batches[1],
        ).rows
        for device in ("auto", "cpu")
    }
    assert json.dumps(rows["auto"]) == json.dumps(rows["cpu"])  # auto is the CPU on a machine without CUDA
    assert on_device("no batch: the reason", torch.device("cpu")) == "no batch: the reason"
    moved = on_device(batch(), torch.device("meta"))  # a device other than the batch's: every tensor goes there
    assert [t.device.type for t in moved] == ["meta", "meta"]
    with pytest.raises(ParamsError, match="^features.device must be auto, cpu or cuda, got 'gpu'$"):
        dataclasses.replace(PARAMS, device="gpu").check()
    if not torch.cuda.is_available():
        cuda = "^features.device is cuda but no CUDA device is visible; set features.device: auto or cpu$"
        with pytest.raises(ParamsError, match=cuda):
            dataclasses.replace(PARAMS, device="cuda").check()
        with pytest.raises(ParamsError, match="^features.device=cuda but no CUDA device is visible"):
            checkpoint_features(tiny_model(3).state_dict(), CONFIG, batch(), dataclasses.replace(PARAMS, device="cuda"))


def test_process_pool_gives_the_in_process_tables(tmp_path):
    # 8 checkpoints = 4 per worker: the pool (fork-server workers) is used, not the in-process path.
    write_run(tmp_path, range(0, 800, 100))
    expected = run_tables(tmp_path / "run", tmp_path / "corpus", tmp_path / "one")
    pooled = run_tables(tmp_path / "run", tmp_path / "corpus", tmp_path / "two", dataclasses.replace(PARAMS, workers=2))
    for a, b in zip(expected, pooled, strict=True):
        pd.testing.assert_frame_equal(a, b)


def test_kill_9_of_the_features_stage_leaves_no_process_behind(tmp_path):
    """Workers, their fork server and the resource tracker die with a SIGKILLed stage."""
    import os
    import signal
    import subprocess
    import time
    from pathlib import Path

    import psutil

    repo = Path(__file__).resolve().parents[2]
    features = {"workers": 2, "rep_points": 60, "rep_batch": 4, "betti_scales": 4}
    cmd = stage_project(tmp_path, range(0, 4000, 100), features)  # 40 checkpoints: seconds of work for two workers
    stage = subprocess.Popen(cmd, cwd=tmp_path, env=os.environ | {"PYTHONPATH": str(repo)})
    family = []
    try:
        deadline = time.time() + 600  # a guard against a hang only
        while True:
            assert stage.poll() is None, "the stage ended before its workers started; nothing was tested"
            family = psutil.Process(stage.pid).children(recursive=True)
            if sum(p.ppid() != stage.pid for p in family) >= 2:  # fork server, resource tracker, workers
                break
            assert time.time() < deadline
            time.sleep(0.01)
    finally:
        stage.send_signal(signal.SIGKILL)
        stage.wait()
    assert stage.returncode == -signal.SIGKILL and len(family) >= 3
    _, alive = psutil.wait_procs(family, timeout=30)
    for leftover in alive:  # so that a failure does not leak them either
        leftover.kill()
    assert not alive, [" ".join(p.cmdline()) for p in alive]


def test_batch_bpb_is_the_summed_cross_entropy_over_the_bytes_and_null_with_a_reason_without_them():
    x, y = batch()
    model = tiny_model(4)
    n_bytes = float(y.numel()) * 1.25  # as if a quarter of the targets were two-byte characters
    with torch.no_grad():
        logits = model(x)
        nats = float(torch.nn.functional.cross_entropy(logits.reshape(-1, 128), y.reshape(-1), reduction="sum"))
    rows = {
        (r[0], r[1]): (r[2], r[3])
        for r in checkpoint_features(model.state_dict(), CONFIG, (x, y), PARAMS, n_bytes=n_bytes).rows
    }
    assert rows[("all", "batch_bpb")][0] == pytest.approx(nats / np.log(2) / n_bytes, rel=1e-5)
    rows = {(r[0], r[1]): (r[2], r[3]) for r in checkpoint_features(model.state_dict(), CONFIG, (x, y), PARAMS).rows}
    assert np.isnan(rows[("all", "batch_bpb")][0]) and "bytes" in rows[("all", "batch_bpb")][1]


def test_no_forward_pass_runs_when_no_family_that_is_on_reads_it():
    params = dataclasses.replace(PARAMS, families=("np", "vr", "spectral", "scale_free"))
    weights = {name: np.random.default_rng(i).normal(size=(8, 6)) for i, name in enumerate(("a", "b"))}

    def forward():
        raise AssertionError("the forward pass ran")

    result = linear_and_forward_features({k: (lambda w=w: w.copy()) for k, w in weights.items()}, 3.0, forward, params)
    by_name = {(layer, name): (value, reason) for layer, name, value, reason in result.rows}
    for name in ("grad_norm", "batch_loss", "rep_tp0", "ls_rand_minima", "gt_tp0", "rep_alpha"):
        assert np.isnan(by_name[(ALL, name)][0]) and by_name[(ALL, name)][1] == OFF, name
    assert np.isfinite(by_name[(ALL, "np_norm")][0]) and np.isnan(by_name[(ALL, "w_alpha")][0])
    assert not needs_forward(params.families) and needs_forward(("np", "heavy_tail"))  # rep_alpha reads the states
