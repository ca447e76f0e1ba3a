"""Changepoints: known breaks of seeded noisy series, none in a constant one, NULL on short ones, jump=1, lags."""

from __future__ import annotations

import numpy as np
import pytest
import ruptures

from topometrics.dynamics.changepoints import (
    MIN_LENGTH,
    changepoint_lags,
    changepoints,
    run_changepoint_rows,
    series_changepoints,
    window_changepoints,
)
from topometrics.models.lr_schedule import Schedule

T = np.arange(51.0)  # 51 checkpoints: a 5000-step run with a checkpoint every 100 steps


def steps_series(breaks=(15, 35), levels=(0.0, 2.0, -1.0)) -> np.ndarray:
    """Three levels over :data:`T`, the second starting at point ``breaks[0]``, the third at ``breaks[1]``."""
    first, second = breaks
    return np.select([first > T, second > T], levels[:2], levels[2])


def kinked(noise: float, rng: np.random.Generator) -> np.ndarray:
    """Slopes 0.1, -0.2, 0.3 with kinks after points 20 and 35, continuous, plus Gaussian noise."""
    z = np.where(T < 20, 0.1 * T, 2.0 - 0.2 * (T - 20))
    z = np.where(T < 35, z, 2.0 - 0.2 * 15 + 0.3 * (T - 35))
    return z + rng.normal(0.0, noise, T.size)


@pytest.mark.parametrize("seed", range(10))
def test_piecewise_constant_breaks_are_found_within_one_checkpoint(seed):
    y = steps_series() + np.random.default_rng(seed).normal(0.0, 0.5, T.size)
    found = changepoints(y)
    assert len(found) == 2 and abs(found[0] - 15) <= 1 and abs(found[1] - 35) <= 1


@pytest.mark.parametrize("seed", range(10))
def test_piecewise_linear_kinks_are_found_within_one_checkpoint(seed):
    found = changepoints(kinked(0.05, np.random.default_rng(seed)), model="slope")
    assert len(found) == 2 and abs(found[0] - 20) <= 1 and abs(found[1] - 35) <= 1


@pytest.mark.parametrize("seed", range(10))
def test_noise_around_a_constant_has_no_changepoint(seed):
    rng = np.random.default_rng(100 + seed)
    assert changepoints(rng.normal(3.0, 0.5, T.size)) == []
    assert changepoints(0.2 * T + rng.normal(0.0, 0.05, T.size), model="slope") == []


def test_a_constant_series_has_no_changepoint():
    assert changepoints(np.full(51, 2.5)) == [] and changepoints(np.full(51, 2.5), model="slope") == []
    got = series_changepoints(np.arange(0, 5001, 100), np.full(51, 2.5))
    assert got.steps == () and np.isnan(got.first_step) and got.count == 0 and got.reason is None


def test_jump_1_keeps_a_break_that_rupturess_default_jump_moves():
    # ruptures' default jump=5 only tries every fifth index: a true break at 23 of 51 becomes two, at 20 and 25
    y = np.r_[np.zeros(23), np.full(28, 3.0)] + np.random.default_rng(0).normal(0.0, 0.5, 51)
    pen = 5.0 * np.log(51) * 0.5**2  # our penalty in the series' own units (noise sd 0.5)
    assert ruptures.Pelt(model="l2", min_size=2).fit(y).predict(pen=pen)[:-1] == [20, 25]
    assert changepoints(y) == [23]


def test_series_changepoints_reports_steps_first_step_and_count():
    steps = np.arange(0, 5001, 100)
    got = series_changepoints(steps, steps_series() + np.random.default_rng(1).normal(0.0, 0.5, T.size))
    assert got.count == 2 and got.first_step == float(got.steps[0]) and got.reason is None
    assert abs(got.steps[0] - 1500) <= 100 and abs(got.steps[1] - 3500) <= 100


def test_short_or_non_finite_series_give_null_with_a_reason():
    got = series_changepoints(np.arange(MIN_LENGTH - 1), np.arange(MIN_LENGTH - 1.0))
    assert got.count is None and np.isnan(got.first_step) and "fewer than" in got.reason
    assert "fewer than" in changepoints(np.arange(MIN_LENGTH, dtype=float), model="slope")
    bad = np.ones(20)
    bad[3] = np.nan
    assert "non-finite" in changepoints(bad)


def test_the_learning_rates_first_changepoint_is_its_warm_up_end():
    steps = np.arange(0, 5001, 100)
    for warmup in (200, 1000):
        schedule = Schedule(5000, warmup, 3e-3, 0.1)
        lr = np.array([schedule.at(int(s)) for s in steps])
        assert series_changepoints(steps, lr, model="slope").first_step == warmup


def test_lags_count_checkpoints_between_first_changepoints():
    rng = np.random.default_rng(2)
    val = steps_series((20, 40), (3.0, 2.0, 1.8)) + rng.normal(0.0, 0.05, T.size)
    feature = steps_series((17, 40), (0.0, 1.0, 1.2)) + rng.normal(0.0, 0.05, T.size)  # three checkpoints earlier
    lr = np.array([Schedule(5000, 1000, 3e-3, 0.1).at(int(s)) for s in np.arange(0, 5001, 100)])  # warm-up: 10
    lags = changepoint_lags(feature, val, lr)
    assert lags["feature_vs_val"] == -3.0 and lags["feature_vs_lr"] == 7.0 and lags["val_vs_lr"] == 10.0
    assert lags["feature_vs_val_reason"] is None
    flat = changepoint_lags(np.full(51, 1.0), val, lr)
    assert np.isnan(flat["feature_vs_val"]) and flat["feature_vs_val_reason"] == "feature: no changepoint"
    assert flat["val_vs_lr"] == 10.0
    short = changepoint_lags(feature[:4], val[:4], lr[:4])
    assert np.isnan(short["val_vs_lr"]) and "fewer than" in short["val_vs_lr_reason"]


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="model"):
        changepoints(np.zeros(10), model="clinear")
    with pytest.raises(ValueError, match="penalty"):
        changepoints(np.zeros(10), penalty=0.0)


def test_run_rows_give_first_steps_counts_and_lags_in_checkpoints():
    rng = np.random.default_rng(0)
    steps = np.arange(40) * 10
    val = np.where(steps < 200, 3.0, 1.0) + rng.normal(0, 0.05, 40)  # break at checkpoint 20
    feature = np.where(steps < 150, 0.0, 2.0) + rng.normal(0, 0.05, 40)  # break at checkpoint 15
    feature[3] = np.nan  # left out of the feature's series (its steps keep their places)
    lr = np.minimum(steps / 100, 1.0)  # warm-up ends at checkpoint 10
    rows = run_changepoint_rows({"val_loss": (steps, val), "f": (steps, feature)}, "val_loss", (steps, lr))
    first = {r["feature"]: (r["estimate"], r["n"]) for r in rows if r["kind"] == "changepoint"}
    assert first == {"val_loss": (200.0, 1), "f": (150.0, 1), "lr": (100.0, 1)}
    lags = {r["other"]: (r["estimate"], r["n"]) for r in rows if r["kind"] == "changepoint_lag"}
    assert lags == {"val_loss": (-5.0, 40), "lr": (5.0, 40)}  # among the loss's 40 checkpoints: 15 - 20, 15 - 10
    no_lr = run_changepoint_rows({"val_loss": (steps, val), "f": (steps, feature)}, "val_loss", "no lr log")
    reasons = [r["reason"] for r in no_lr if "lr" in (r["feature"], r.get("other"))]
    assert reasons == ["no lr log", "lr: no lr log"]
    flat = run_changepoint_rows({"val_loss": (steps, np.ones(40))}, "val_loss", "x")[0]
    assert flat["n"] == 0 and np.isnan(flat["estimate"]) and flat["reason"] == "no changepoint"


def test_the_window_sees_only_the_checkpoints_up_to_the_cutoff():
    steps = T * 100  # a 5,000-step run
    level = steps_series()  # breaks at points 15 and 35: steps 1,500 and 3,500
    count, first = window_changepoints([(steps, level)], cutoff=2500, total_steps=5000)
    assert (count, first) == (1.0, 0.3)  # only the first break has happened by step 2,500
    assert window_changepoints([(steps, level)], cutoff=5000, total_steps=5000) == (2.0, 0.3)
    # the future cannot leak in: a series that differs only after the cutoff gives the same answer
    changed = np.where(steps > 2500, level + 7.0 * np.sin(T), level)
    assert window_changepoints([(steps, changed)], 2500, 5000) == (1.0, 0.3)


def test_the_window_sums_counts_takes_the_earliest_break_and_reads_none_yet_as_the_cutoff():
    steps = T * 100
    early = steps_series(breaks=(10, 40))  # steps 1,000 and 4,000
    flat = np.full(T.size, 3.0)
    assert window_changepoints([(steps, steps_series()), (steps, early)], 5000, 5000) == (4.0, 0.2)
    assert window_changepoints([(steps, flat)], 3000, 5000) == (0.0, 0.6)  # none yet: the cutoff's share
    # unordered steps and non-finite values are handled as the per-series rows handle them
    shuffled = np.random.default_rng(0).permutation(T.size)
    with_gaps = np.where(T % 7 == 2, np.nan, early)  # not at a break
    assert window_changepoints([(steps[shuffled], with_gaps[shuffled])], 5000, 5000) == (2.0, 0.2)


def test_a_window_too_short_for_any_series_is_null_not_no_change():
    steps = T * 100
    count, first = window_changepoints([(steps, steps_series())], cutoff=(MIN_LENGTH - 2) * 100, total_steps=5000)
    assert np.isnan(count) and np.isnan(first)
    assert all(np.isnan(window_changepoints([], 5000, 5000)))
    # one series long enough is enough: the short one is left out, not counted as unchanged
    short = (steps[:3], np.array([0.0, 5.0, 0.0]))
    assert window_changepoints([short, (steps, steps_series())], 5000, 5000) == (2.0, 0.3)
