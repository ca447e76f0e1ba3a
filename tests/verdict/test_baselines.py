"""topometrics.verdict.baselines: the baselines' columns, a run's recipe columns, and the monotone basis."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from topometrics.verdict import baselines


def test_each_baseline_adds_its_parts_columns_to_the_smaller_ones():
    loss, norm, recipe = (baselines.columns(name) for name in ("loss", "norm", "recipe"))
    assert loss == baselines.LOSS and norm == (*loss, *baselines.NORM)
    assert recipe == (*norm, *baselines.RECIPE_COLUMNS) and baselines.DEFAULT == "recipe"
    assert len(set(recipe)) == len(recipe)  # no column in two parts
    with pytest.raises(KeyError):
        baselines.columns("curvature")


def test_a_runs_recipe_columns_come_from_its_config_and_nan_for_what_it_does_not_state():
    config = {"n_params": 1000, "model": {"vocab_size": 256}}
    config |= {"recipe": {"lr": 0.003, "weight_decay": 0.1, "warmup": 50, "steps": 1000, "batch_size": 32}}
    got = baselines.recipe_inputs(config)
    assert list(got) == list(baselines.RECIPE_COLUMNS)
    assert got["recipe_log_lr"] == pytest.approx(math.log(0.003)) and got["recipe_warmup_share"] == 0.05
    assert got["recipe_log_params"] == pytest.approx(math.log(1000)) and got["recipe_wsd"] == 0.0
    assert got["recipe_decay_fraction"] == 0.0  # the cosine has no decay phase
    wsd = baselines.recipe_inputs({"recipe": {"schedule": "wsd", "steps": 0}})
    assert wsd["recipe_wsd"] == 1.0 and wsd["recipe_decay_fraction"] == 0.2
    assert math.isnan(wsd["recipe_warmup_share"]) and math.isnan(wsd["recipe_log_lr"])  # an external series
    nothing = baselines.recipe_inputs(None)  # no config: the cosine (its flags 0), every other column NaN
    flags = ("recipe_wsd", "recipe_constant_decay", "recipe_decay_fraction")
    assert [nothing[k] for k in flags] == [0.0, 0.0, 0.0]
    assert all(math.isnan(v) for k, v in nothing.items() if k not in flags)


def test_the_flexible_basis_adds_normal_scores_and_a_square_for_a_varying_flexible_column():
    x = np.array([3.0, 1.0, np.nan, 2.0, 10.0])
    frame = pd.DataFrame({"weight_norm_level": x, "loss_drop": 1.0, "recipe_log_lr": 0.5})  # lr constant: no basis
    out, cols = baselines.flexible_basis(frame, ["loss_drop", "weight_norm_level", "recipe_log_lr"])
    assert cols == ["loss_drop", "weight_norm_level", "recipe_log_lr", "weight_norm_level~rank", "weight_norm_level~sq"]
    ok = np.isfinite(x)
    expected = stats.norm.ppf((stats.rankdata(x[ok]) - 0.5) / 4)
    np.testing.assert_allclose(out["weight_norm_level~rank"].to_numpy()[ok], expected)
    z = (x[ok] - x[ok].mean()) / x[ok].std()
    np.testing.assert_allclose(out["weight_norm_level~sq"].to_numpy()[ok], z**2)
    assert out["weight_norm_level~rank"].isna().tolist() == [False, False, True, False, False]
    assert "weight_norm_level~rank" not in frame  # the input frame is left as it was
    same, _ = baselines.flexible_basis(frame.assign(weight_norm_level=np.exp(x)), cols[:3])
    np.testing.assert_allclose(same["weight_norm_level~rank"], out["weight_norm_level~rank"])  # monotone-invariant
