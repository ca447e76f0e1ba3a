"""The live monitor's loss surface: the same landscape and curvature rows as the checkpoint path, when asked."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file
from threadpoolctl import threadpool_limits

from tests.features.helpers import OneThread, train_steps
from tests.repo_params import features_params, train_params
from topometrics.features import checkpoint, forward
from topometrics.features.monitor import RunMonitors, TopologyCallback, TopologyMonitor
from topometrics.features.monitor_surface import (
    SurfaceSource,
    model_snapshot,
    rebuilt_model,
    state_bytes,
    surface_rows,
)
from topometrics.models.model import GPT, GPTConfig, linear_weights
from topometrics.params import FeaturesParams
from topometrics.params_sources import SeriesSource
from topometrics.series.source_shards import log_series
from topometrics.training.monitor_log import read_log
from topometrics.vocabulary import CURVATURE, LANDSCAPE, model_only

PARAMS = features_params(
    max_points=20, workers=1, rep_points=40, rep_batch=2, landscape_grid=5, landscape_batch=2, landscape_every=2,
    hessian_iters=30,
)  # fmt: skip
CONFIG = GPTConfig(vocab_size=128, context=16, hidden=16, layers=1, heads=2)
SURFACE = set(model_only(LANDSCAPE) + model_only(CURVATURE))
NOT_DUE = "not a loss-surface checkpoint (features.landscape_every = 2)"


def validation_tokens(n: int = 200) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 128, n).astype(np.uint8)


def tiny_gpt(seed: int = 0) -> GPT:
    model = GPT(CONFIG)
    model.init_weights(torch.Generator().manual_seed(seed))
    return model


def surface_of(rows: pd.DataFrame) -> pd.DataFrame:
    picked = rows[rows["feature"].isin(SURFACE)]
    picked = picked[["layer", "feature", "value", "reason"]].astype({"layer": object, "reason": object})
    picked["reason"] = picked["reason"].where(picked["reason"].notna(), None)  # Parquet reads None back as NaN
    return picked.sort_values("feature").reset_index(drop=True)


def checkpoint_surface(path: Path, tokens: np.ndarray, params: FeaturesParams, index: int) -> pd.DataFrame:
    """The features stage's rows of a saved checkpoint (its worker's one thread), surface rows only."""
    threads = torch.get_num_threads()
    try:
        with threadpool_limits(1):
            torch.set_num_threads(1)

            batch = forward.validation_batch(tokens, CONFIG.context, params.rep_batch)
            surface = forward.surface_batch(tokens, CONFIG.context, params, index)
            result = checkpoint.checkpoint_features(load_file(path), CONFIG, batch, params, surface)
    finally:
        torch.set_num_threads(threads)
    return surface_of(checkpoint.features_frame(result, "r", 0, 0))


def test_the_monitors_surface_equals_the_checkpoint_paths_at_the_same_step(tmp_path):
    model, tokens, saved = tiny_gpt(), validation_tokens(), {}
    source = SurfaceSource(tokens, CONFIG.context)
    with TopologyMonitor(tmp_path / "log", every=2, params=PARAMS, log=lambda _: None, surface=source) as monitor:
        monitor.step(model, 0)
        for step, loss in train_steps(model, 4):
            if step % 2 == 0:  # the checkpoint a run would write at this step
                saved[step] = tmp_path / f"step_{step}.safetensors"
                save_file({k: v.detach().clone() for k, v in model.state_dict().items()}, saved[step])
            monitor.step(model, step, loss=loss)
    features, _ = read_log(tmp_path / "log")
    at = {step: surface_of(features[features["step"] == step]) for step in (0, 2, 4)}
    assert set(at[4]["feature"]) == SURFACE and (at[4]["layer"] == "all").all()
    assert at[4]["value"].notna().sum() >= 10  # computed: the slices' summaries at least
    # measurement 2 (step 4) is due, as the run's third checkpoint is: the very same values and reasons
    pd.testing.assert_frame_equal(at[4], checkpoint_surface(saved[4], tokens, PARAMS, index=2))
    assert at[2]["value"].isna().all() and set(at[2]["reason"]) == {NOT_DUE}  # measurement 1: not due
    assert at[2].equals(checkpoint_surface(saved[2], tokens, PARAMS, index=1))
    assert at[0]["value"].notna().any() and not at[0].equals(at[4])  # step 0 is due too, and the weights moved
    (rows,) = log_series("tiny-live", SeriesSource(log=str(tmp_path / "log"), seed=3)).features  # the series stage
    assert set(rows["rung"]) == {"tiny-live"} and surface_of(rows[rows["step"] == 4]).equals(at[4])


def test_off_by_default_the_monitor_writes_the_weight_features_alone(tmp_path):
    model = tiny_gpt()
    assert train_params().monitor_surface is False and RunMonitors(10, PARAMS).corpus is None
    with TopologyMonitor(tmp_path, every=1, params=PARAMS, log=lambda _: None) as monitor:
        assert monitor.surface is None
        monitor.step(model, 0)
    features, _ = read_log(tmp_path)
    assert not set(features["feature"]) & SURFACE
    want = checkpoint.features_frame(
        checkpoint.weight_features(linear_weights(model.state_dict(), 1), PARAMS), "live", 0, 0
    )
    pd.testing.assert_frame_equal(features, want, check_dtype=False)


def test_a_non_finite_loss_on_the_slices_is_null_with_the_reason_and_the_rest_is_measured(tmp_path):
    model = tiny_gpt()
    with torch.no_grad():
        model.tok_emb.weight.mul_(1e19 / 0.02)  # finite, but the float32 slices overflow at every point
    source = SurfaceSource(validation_tokens(), CONFIG.context)
    with TopologyMonitor(tmp_path, every=1, params=PARAMS, log=lambda _: None, surface=source) as monitor:
        monitor.step(model, 0)
    features, _ = read_log(tmp_path)
    rows = surface_of(features).set_index("feature")
    slices = rows[rows.index.str.startswith("ls_")]
    overflow = "non-finite loss at 25 of 25 slice points"
    assert slices["value"].isna().all() and set(slices.loc[slices.index.str.startswith("ls_rand_"), "reason"]) == {
        overflow
    }
    # the Hessian slice first needs the top eigenvectors: whether their float64 products or the float32 slice
    # overflow first depends on the CPU's kernels (both seen on CI machines); either way NULL with that reason
    hess = set(slices.loc[slices.index.str.startswith("ls_hess_"), "reason"])
    assert len(hess) == 1 and hess <= {overflow, "non-finite Hessian-vector product"}
    weights = features[~features["feature"].isin(SURFACE)]
    assert weights["value"].notna().any()  # the weight features of the same snapshot are there


def test_a_diverged_snapshot_or_a_short_split_gives_null_surface_rows_with_the_reason():
    model = tiny_gpt()
    with torch.no_grad():
        model.blocks[0].mlp.up.weight[0, 0] = float("nan")

    batch = forward.surface_batch(validation_tokens(), CONFIG.context, PARAMS, 0)
    rows = surface_rows(model_snapshot(model, batch), PARAMS).rows
    assert {r[1] for r in rows} == SURFACE and all(np.isnan(r[2]) for r in rows)
    assert {r[3] for r in rows} == {"diverged: non-finite weights in 1 tensors (1 entries)"}
    short = forward.surface_batch(validation_tokens(20), CONFIG.context, PARAMS, 0)
    assert {r[3] for r in surface_rows(model_snapshot(model, short), PARAMS).rows} == {short}
    off = surface_rows(model_snapshot(tiny_gpt(), batch), dataclasses.replace(PARAMS, families=("vr",))).rows
    assert {r[3] for r in off} == {"family switched off (features.families)"}
    other = surface_rows(model_snapshot(torch.nn.Linear(2, 2), batch), PARAMS).rows
    assert {r[3] for r in other} == {"model not rebuildable for the loss surface: Linear is neither our GPT nor a "
                                     "transformers model"}  # fmt: skip


def test_our_gpt_is_rebuilt_on_the_snapshots_own_arrays_with_the_same_logits():
    model = tiny_gpt()
    snapshot = model_snapshot(model, forward.surface_batch(validation_tokens(), CONFIG.context, PARAMS, 0))
    rebuilt, logits = rebuilt_model(snapshot)
    assert logits is None
    for name, tensor in rebuilt.state_dict().items():  # the weights held once: the snapshot's, not a copy
        assert tensor.data_ptr() == snapshot.state[name].ctypes.data, name
    x = torch.from_numpy(snapshot.batch[0])
    assert torch.equal(rebuilt(x), model(x))


def test_a_loss_surface_snapshot_counts_the_whole_model_against_the_bytes_in_flight(tmp_path):
    model, lines = tiny_gpt(), []
    source = SurfaceSource(validation_tokens(), CONFIG.context)
    monitor = TopologyMonitor(tmp_path, every=1, params=PARAMS, log=lines.append, surface=source)
    weights, whole = monitor.snapshot_bytes(model), state_bytes(model)
    assert whole == sum(p.numel() * 4 for p in model.state_dict().values())
    monitor.max_pending_bytes = 2 * weights + whole
    with monitor:
        for step in range(4):  # back to back: due at 0 and 2 (features.landscape_every = 2)
            monitor.step(model, step)
    assert monitor.measured == [0, 1] and monitor.skipped == [2, 3]  # step 2 would hold a second whole model
    assert lines[0].startswith("monitor: estimate for ")  # the cost line comes first, then the skip
    assert lines[1] == "monitor: step 2 not measured, 2 measurements still running"


def test_through_the_trainer_callback_a_transformers_model_gets_the_series_checkpoints_surface(tmp_path):
    pytest.importorskip("accelerate", reason="the Hugging Face Trainer needs accelerate, not installed here")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from topometrics.series.checkpoint import load_causal_lm
    from topometrics.series.hub import SeriesCheckpoint

    tokens = validation_tokens(400)
    windows = torch.from_numpy(tokens[:384].astype(np.int64)).view(-1, 16)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=128, n_positions=16))
    args = TrainingArguments(
        output_dir=str(tmp_path / "run"), max_steps=2, per_device_train_batch_size=4, learning_rate=3e-3,
        save_steps=2, report_to=[], use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0,
    )  # fmt: skip
    params = dataclasses.replace(PARAMS, landscape_every=1)
    source = SurfaceSource(tokens, 16)
    monitor = TopologyMonitor(tmp_path / "live", every=2, params=params, log=lambda _: None, surface=source)
    train = [{"input_ids": w, "labels": w} for w in windows]
    threads = torch.get_num_threads()
    try:
        Trainer(model=model, args=args, train_dataset=train, callbacks=[OneThread(), TopologyCallback(monitor)]).train()
        folder = tmp_path / "run" / "checkpoint-2"
        saved = load_causal_lm(SeriesCheckpoint(2, "checkpoint-2", (folder / "model.safetensors",), folder, None))
        with threadpool_limits(1):  # the series' forward pass, on one thread as in its worker
            surface = forward.loss_surface(saved, forward.surface_batch(tokens, 16, params, 1), lambda out: out.logits)
            want = surface_of(checkpoint.features_frame(checkpoint.surface_features(surface, params), "r", 0, 2))
    finally:
        torch.set_num_threads(threads)
    features, _ = read_log(tmp_path / "live")
    got = surface_of(features[features["step"] == 2])
    assert got["value"].notna().sum() >= 10
    pd.testing.assert_frame_equal(got, want)


@pytest.mark.slow  # trains a run in a pool process, beside its monitor's worker
def test_the_train_stages_runs_get_the_surface_of_their_checkpoints_with_train_monitor_surface(tmp_path):
    from stages.train import observers
    from tests.run_helpers import config, corpus, files
    from tests.training.helpers import quiet
    from topometrics.models.tokens import load_tokens
    from topometrics.training.run_queue import Pool, train_runs

    data, run = corpus(tmp_path / "corpus"), files(tmp_path, config(seed=1, steps=30))  # checkpoints every 10
    train = dataclasses.replace(train_params(), monitor_every=10, monitor_surface=True)
    (_, monitors) = observers(train, PARAMS, data)
    assert monitors == RunMonitors(10, PARAMS, data)
    assert observers(dataclasses.replace(train, monitor_surface=False), PARAMS, data)[1].corpus is None
    train_runs([run], data, Pool(1, 1, ("cpu",)), log=quiet, observers=[monitors])
    features, _ = read_log(run.run_dir / "monitor")
    tokens, context = load_tokens(data, "val"), run.config.model.context
    for index, step in enumerate((0, 10, 20, 30)):
        got = surface_of(features[features["step"] == step])
        path = run.run_dir / f"step_{step:06d}.safetensors"
        threads = torch.get_num_threads()
        try:
            with threadpool_limits(1):
                torch.set_num_threads(1)

                batch = forward.validation_batch(tokens, context, PARAMS.rep_batch)
                surface = forward.surface_batch(tokens, context, PARAMS, index)
                result = checkpoint.checkpoint_features(load_file(path), run.config.model, batch, PARAMS, surface)
        finally:
            torch.set_num_threads(threads)
        pd.testing.assert_frame_equal(got, surface_of(checkpoint.features_frame(result, "r", 0, step)))
        assert got["value"].notna().any() == (index % 2 == 0), step  # due at 0 and 20 (landscape_every = 2)
