"""The trajectory rows: the PH0 dimension of a run's sketched iterates (and of its checkpoints) per checkpoint."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

from tests.repo_params import features_params
from topometrics.dynamics.phdim import trailing_dimension
from topometrics.dynamics.trajectory import NO_SKETCH, Iterates, checkpoint_iterates, trajectory_values, window
from topometrics.features.run_shards import read_tables
from topometrics.features.sweep import run_shards
from topometrics.models.checkpoints import save_checkpoint
from topometrics.models.model import GPT, GPTConfig
from topometrics.params_schema import ParamsError
from topometrics.training.sketch import SKETCH_FILE

CONFIG = GPTConfig(context=8, hidden=8, layers=1, heads=2)
PARAMS = features_params(
    rep_points=30, rep_batch=2, betti_scales=4, workers=1, grad_batch=4, grad_dim=8, landscape_every=100
)
PARAMS = dataclasses.replace(PARAMS, landscape_grid=3, hessian_iters=4, phdim_window=500, phdim_sizes=(10, 20, 40))


def square_sketch(n: int = 60, every: int = 10) -> Iterates:
    return Iterates(np.arange(n) * every, np.random.default_rng(0).random((n, 5)))


def test_the_rows_are_the_trailing_dimension_of_the_window_and_only_of_it():
    sketch = square_sketch(100)
    rows = dict(
        (name, (v, why)) for _, values, why in trajectory_values(sketch, "x", 990, PARAMS) for name, v in values.items()
    )
    expected = trailing_dimension(*sketch, 990, 500, (10, 20, 40), 1.0, 0)
    assert rows["traj_phdim"] == (expected.dimension, None) and np.isfinite(expected.dimension)
    assert rows["traj_ckpt_phdim"][1] == "x" and np.isnan(rows["traj_ckpt_phdim"][0])
    inside = window(sketch, 990, PARAMS)
    assert inside.steps.tolist() == list(range(500, 1000, 10))  # (990 - 500, 990]
    moved = Iterates(sketch.steps, sketch.points.copy())
    moved.points[:49] *= 1e3  # iterates before the window change nothing
    assert trajectory_values(moved, "x", 990, PARAMS)[0] == trajectory_values(sketch, "x", 990, PARAMS)[0]


def test_too_few_iterates_in_the_window_is_null_with_the_reason():
    (_, values, why), _ = trajectory_values(square_sketch(30), "x", 30, PARAMS)  # 4 iterates: steps 0..30
    assert np.isnan(values["traj_phdim"]) and why.startswith("steps -469..30: 4 points allow 0 subsample sizes")


def test_checkpoints_as_iterates_are_a_linear_map_of_their_weights():
    rng = np.random.default_rng(1)
    a, b = [rng.random((6, 4)), rng.random((3, 3))], [rng.random((6, 4)), rng.random((3, 3))]
    it = checkpoint_iterates([0, 5, 9], [a, b, [x - y for x, y in zip(a, b, strict=True)]], seed=0)
    assert it.points.shape == (3, 64) and it.steps.tolist() == [0, 5, 9]
    np.testing.assert_allclose(it.points[0] - it.points[1], it.points[2], atol=1e-5)


def write_run(root, sketch: bool):
    (root / "run").mkdir()
    (root / "corpus").mkdir()
    np.random.default_rng(0).integers(0, 128, 200).astype(np.uint8).tofile(root / "corpus" / "val.u8")
    for step in (0, 100, 200):
        model = GPT(CONFIG)
        model.init_weights(torch.Generator().manual_seed(step))
        meta = {"step": step, "rung": "tiny", "seed": 1, "config": CONFIG.to_dict(), "recipe_fingerprint": "t"}
        save_checkpoint(root / "run", model, meta | {"val_loss": 4.0, "train_loss": 4.0})
    if sketch:
        points = np.random.default_rng(2).random((41, 4))
        lines = ["step,s0,s1,s2,s3"] + [f"{5 * i}," + ",".join(map(str, p)) for i, p in enumerate(points)]
        (root / "run" / SKETCH_FILE).write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("sketch", [True, False])
def test_a_run_gets_its_trajectory_rows_beside_the_distances(tmp_path, sketch):
    write_run(tmp_path, sketch)
    run_shards(tmp_path / "run", tmp_path / "corpus", PARAMS, tmp_path / "shards")
    features, _ = read_tables(tmp_path / "shards")
    rows = features[features["feature"].str.startswith("traj_")].set_index(["step", "feature"])
    assert len(rows) == 6 and set(rows["layer"]) == {"all"}
    last = rows.loc[(200, "traj_phdim")]
    if sketch:  # 41 iterates in (-300, 200]: sizes 10, 20, 40
        assert np.isfinite(last["value"]) and pd.isna(last["reason"])
    else:
        assert np.isnan(last["value"]) and last["reason"] == NO_SKETCH
    ckpt = rows.loc[(200, "traj_ckpt_phdim")]  # 3 checkpoints: too few
    assert np.isnan(ckpt["value"]) and "3 points allow 0 subsample sizes" in ckpt["reason"]


def test_phdim_sizes_need_three_fittable_sizes():
    with pytest.raises(ParamsError, match="phdim_sizes"):
        dataclasses.replace(PARAMS, phdim_sizes=(4, 10, 20)).check()
