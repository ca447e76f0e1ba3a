"""topometrics.analysis.predict: the schedule, loss-curve fits on synthetic curves, window summaries, LOO CV."""

import numpy as np
import pandas as pd
import pytest

from tests.repo_params import analysis_params
from topometrics.analysis import predict
from topometrics.models.lr_schedule import Schedule

T = np.arange(100, 5001, 100)  # the paper's checkpoints after step 0


def test_observed_window_includes_the_cutoff_checkpoint():
    assert predict.observed(T, 0.3 * 5000).sum() == 15


def test_loss_power_law_recovers_known_parameters_from_noisy_curve():
    rng = np.random.default_rng(0)
    loss = predict.loss_power_law(T, 40.0, 0.6, 1.5) + rng.normal(0, 0.002, len(T))
    fit, final = predict.fit_loss_power_law(T, loss, 5000, warmup=200)
    assert fit.ok and fit.n == 48  # checkpoints inside the warm-up are left out
    assert (fit.params["a"], fit.params["b"], fit.params["c"]) == pytest.approx((40.0, 0.6, 1.5), rel=0.1)
    assert final == pytest.approx(predict.loss_power_law(5000, 40.0, 0.6, 1.5), abs=0.005)
    early, final_early = predict.fit_loss_power_law(T[:15], loss[:15], 5000, warmup=200)
    assert early.ok and final_early == pytest.approx(predict.loss_power_law(5000, 40.0, 0.6, 1.5), abs=0.02)


def test_loss_power_law_failure_is_recorded():
    fit, final = predict.fit_loss_power_law([0, 100, 200], [4.8, 3.0, 2.5], 5000)
    assert (fit.status, final) == ("failed", None)
    assert fit.reason == "need at least 4 checkpoints after step 0, got 2"


def test_multi_power_law_recovers_known_parameters_on_a_cosine_schedule():
    sched = Schedule(5000, 200, 3e-3)
    truth = (1.5, 0.4, 0.5, 0.3, 2.0)
    rng = np.random.default_rng(1)
    loss = predict.multi_power_law(T, sched, *truth) + rng.normal(0, 0.002, len(T))
    fit, final = predict.fit_multi_power_law(T[:25], loss[:25], sched)  # the first half of training
    assert fit.ok, fit.reason
    assert (fit.params["L0"], fit.params["A"], fit.params["alpha"]) == pytest.approx(truth[:3], rel=0.1)
    assert final == pytest.approx(predict.multi_power_law([5000], sched, *truth)[0], abs=0.01)


def test_multi_power_law_annealing_bonus_grows_as_the_lr_decays():
    sched = Schedule(1000, 100)
    without = predict.multi_power_law([300, 1000], sched, 1.0, 0.5, 0.5, 0.0, 1.0)
    with_bonus = predict.multi_power_law([300, 1000], sched, 1.0, 0.5, 0.5, 0.3, 1.0)
    gap = without - with_bonus
    assert 0 < gap[0] < gap[1] <= 0.3  # the bonus is at most B * (eta_peak - eta_end) = B


def test_window_summary_of_a_line():
    t = np.arange(0, 1001, 100.0)
    level, rate = predict.window_summary(t, 2.0 + 0.001 * t, cutoff=500)
    assert level == pytest.approx(2.5)  # mean of the last quarter of the 6 observed points: the last one
    sd = np.std([2.3, 2.4, 2.5])  # the last half's values
    assert rate == pytest.approx(0.001 * 500 / np.hypot(level, sd))
    assert rate == pytest.approx(0.001 * 500 / level, rel=0.01)  # far from zero: slope / |level|


def test_window_summary_rate_stays_finite_when_the_level_crosses_zero():
    # slope / |level| exploded here (level 1e-12): the scale sqrt(level^2 + sd^2) cannot be ~0 for a moving series
    t = np.arange(0, 1001, 100.0)
    for crossing in (500.0, 500.0 + 1e-9, 450.0):
        level, rate = predict.window_summary(t, 0.001 * (t - crossing), cutoff=500)
        assert abs(level) < 0.06 and np.isfinite(rate)
        assert 0 < rate <= 2 * np.sqrt(12)  # a rising straight line, whatever its offset
    assert predict.window_summary(t, np.zeros_like(t), cutoff=500) == (0.0, 0.0)


def test_window_summary_needs_three_points():
    assert np.isnan(predict.window_summary([0, 100, 900], [1, 2, 3], cutoff=200)).all()


def test_value_at_is_the_last_observed_checkpoints_value():
    t, v = [0, 50, 100, 150, 200], [np.nan, np.nan, np.nan, 1.4, 1.5]
    assert predict.value_at(t, v, cutoff=200) == 1.5 and predict.value_at(t, v, cutoff=199) == 1.4
    assert np.isnan(predict.value_at(t, v, cutoff=100)) and np.isnan(predict.value_at(t, v, cutoff=-1))


def test_a_trajectory_dimension_is_an_input_at_a_fraction_where_only_its_last_window_has_one():
    from collections import namedtuple

    from topometrics.analysis import tables

    run = namedtuple("Run", "rung variant seed actual")("tiny", "base", 1, 2.0)
    t = np.arange(0, 1001, 50.0)
    dims = np.where(t >= 300, 1.2 + t / 1000, np.nan)  # a window of enough iterates from step 300 on
    series = {("tiny", "base", 1): {"val_loss": (t, 4.0 - t / 1000), "traj_phdim": (t, dims), "np": (t, t / 100)}}
    _, _, at_30 = tables._curve_predictions(run, Schedule(1000, 100), 0.3, series)
    assert at_30["traj_phdim_level"] == pytest.approx(1.5) and np.isnan(at_30["traj_phdim_rate"])
    _, _, at_50 = tables._curve_predictions(run, Schedule(1000, 100), 0.5, series)
    assert at_50["traj_phdim_level"] == pytest.approx(1.7) and np.isfinite(at_50["traj_phdim_rate"])
    assert at_50["np_level"] == pytest.approx(np.mean([4.5, 5.0]))  # other series: the last quarter's mean
    _, _, at_20 = tables._curve_predictions(run, Schedule(1000, 100), 0.2, series)
    assert np.isnan(at_20["traj_phdim_level"])  # no window with enough iterates yet: NULL, never a guess


def test_the_changepoint_inputs_at_a_fraction_come_from_the_topological_headline_series_observed_by_then():
    from collections import namedtuple

    from topometrics.analysis import tables

    run = namedtuple("Run", "rung variant seed actual")("tiny", "base", 1, 2.0)
    t = np.arange(0, 1001, 50.0)
    step_at_400 = np.where(t < 400, 1.0, 3.0)  # a topological headline feature with one break, at step 400
    spectral = np.where(t < 200, 1.0, 9.0)  # w_spec breaks earlier, but is not topological: not watched
    series = {
        ("tiny", "base", 1): {"val_loss": (t, 4.0 - t / 1000), "vr_tp0": (t, step_at_400), "w_spec": (t, spectral)}
    }
    params = analysis_params()
    assert "w_spec" in params.headline_features and "vr_tp0" in params.headline_features
    at = {f: tables._curve_predictions(run, Schedule(1000, 100), f, series, params)[2] for f in (0.2, 0.3, 0.5)}
    assert np.isnan(at[0.2]["cp_count"]) and np.isnan(at[0.2]["cp_first"])  # 5 checkpoints: too few to segment
    assert (at[0.3]["cp_count"], at[0.3]["cp_first"]) == (0.0, 0.3)  # 7 checkpoints, no break yet
    assert (at[0.5]["cp_count"], at[0.5]["cp_first"]) == (1.0, 0.4)
    assert "cp_count" not in tables._curve_predictions(run, Schedule(1000, 100), 0.5, series)[2]  # no params


# --- leave-one-group-out -------------------------------------------------------------------------


def test_cross_validation_never_trains_on_the_held_out_group():
    groups = np.repeat(["tiny", "small", "medium", "large", "xl"], 2)  # two seeds per rung
    rng = np.random.default_rng(0)
    x = rng.normal(size=(10, 2))
    y = x @ [0.5, -0.2] + 0.1
    predicted, trained_on, reasons = predict.cross_validate(x, y, groups)
    for i, group in enumerate(groups):
        assert len(trained_on[i]) == 8
        assert group not in set(groups[trained_on[i]])
    assert predicted == pytest.approx(y, abs=0.05) and reasons == [None] * 10


def test_held_out_target_cannot_leak_into_its_prediction():
    x = np.arange(6.0)[:, None]
    y = 2 * x[:, 0] + 1
    groups = np.arange(6)
    base, *_ = predict.cross_validate(x, y, groups)
    y_leak = y.copy()
    y_leak[2] = 1000.0  # a held-out run's own target must not move its prediction
    leaked, *_ = predict.cross_validate(x, y_leak, groups)
    assert leaked[2] == base[2]


def test_cross_validation_reports_runs_it_cannot_predict():
    x = np.array([[1.0], [np.nan], [3.0], [4.0]])
    predicted, trained_on, reasons = predict.cross_validate(x, np.arange(4.0), ["a", "b", "c", "d"])
    assert np.isnan(predicted[1]) and reasons[1] == "missing feature values in the observed window"
    assert np.isnan(predicted[0]) and reasons[0] == "only 2 training runs outside group a; need 3"


def test_annealing_areas_by_direct_sums():
    sched = Schedule(300, 50, 2e-3, 0.1)
    s1, s2 = predict.annealing_areas(sched)
    eta = np.array([sched.rate(i) / 2e-3 for i in range(301)])
    assert s1[137] == pytest.approx(eta[:138].sum() / 300, rel=1e-12)
    m, total = 0.0, []
    for i in range(301):  # the momentum recursion, step by step
        m = predict.ANNEALING_DECAY * m + (eta[i - 1] - eta[i] if i > 50 else 0.0)
        total.append(m)
    np.testing.assert_allclose(s2, np.cumsum(total) / 300, rtol=1e-10, atol=1e-15)
    assert np.all(s2[:51] == 0) and s2[-1] > 0


def test_lr_annealing_law_recovers_known_parameters_and_extrapolates():
    sched = Schedule(5000, 200, 3e-3)
    s1, s2 = predict.annealing_areas(sched)
    truth = (1.4, 0.5, 0.45, 0.3)
    rng = np.random.default_rng(2)
    loss = predict.lr_annealing_law(s1[T], s2[T], *truth) + rng.normal(0, 0.002, len(T))
    fit, final = predict.fit_lr_annealing(T[:25], loss[:25], sched)
    assert fit.ok, fit.reason
    assert (fit.params["L0"], fit.params["A"], fit.params["alpha"]) == pytest.approx(truth[:3], rel=0.15)
    assert final == pytest.approx(predict.lr_annealing_law(s1[-1], s2[-1], *truth), abs=0.03)
    full, final_full = predict.fit_lr_annealing(T, loss, sched)
    assert full.params["C"] == pytest.approx(0.3, rel=0.15)
    assert final_full == pytest.approx(predict.lr_annealing_law(s1[-1], s2[-1], *truth), abs=0.005)


def test_lr_annealing_failure_is_recorded():
    fit, final = predict.fit_lr_annealing([0, 100, 200, 300], [4.0, 3.0, 2.6, 2.4], Schedule(1000, 100))
    assert (fit.status, final) == ("failed", None) and "at least 5 checkpoints" in fit.reason


def test_the_summary_groups_failed_predictions_by_cause():
    reasons = ["need at least 4 checkpoints after step 0, got 2", "need at least 6 checkpoints for 5 parameters, got 1"]
    reasons += ["missing feature values in the observed window"] * 3
    reasons += ["only 1 training runs outside group a; need 3", "only 1 training runs outside group b; need 3"]
    frame = pd.DataFrame({"status": ["failed"] * len(reasons) + ["ok"], "reason": [*reasons, None]})
    assert predict.prediction_summary(frame) == (
        "8 predictions (7 failed: 2 need ≥ 4-6 checkpoints after step 0 up to the fraction, got at most 2; "
        "3 lack an input before the fraction (a failed loss-curve fit or a missing feature); "
        "2 have fewer than 3 training runs outside the held-out group)"
    )
    assert predict.prediction_summary(frame.iloc[-1:]) == "1 predictions (0 failed)"


WSD = Schedule(1000, 50, 3e-3, 0.0, "wsd", 0.3)  # stable to update 700, then linear to 0
WSD_CHECKPOINTS = np.arange(50, 1001, 25)


def test_the_multi_power_law_recovers_its_parameters_from_a_wsd_curve_and_needs_that_schedule():
    true = {"l0": 1.2, "a": 0.4, "alpha": 0.5, "b": 0.3, "c": 2.0}
    loss = predict.multi_power_law(WSD_CHECKPOINTS, WSD, **true)
    fit, final = predict.fit_multi_power_law(WSD_CHECKPOINTS, loss, WSD)
    got = [fit.params[k] for k in ("L0", "A", "alpha", "B", "C")]
    np.testing.assert_allclose(got, list(true.values()), rtol=1e-4)
    assert final == pytest.approx(loss[-1], abs=1e-7)
    # the same curve read through the cosine schedule is a different law: no parameter comes back
    cosine_fit, _ = predict.fit_multi_power_law(WSD_CHECKPOINTS, loss, Schedule(1000, 50, 3e-3))
    assert abs(cosine_fit.params["C"] - true["c"]) > 1.0


def test_the_annealing_law_recovers_its_parameters_from_a_wsd_curve():
    s1, s2 = predict.annealing_areas(WSD)
    assert np.all(s2[:701] == 0) and s2[-1] > 0  # no annealing area before the decay starts
    loss = predict.lr_annealing_law(s1[WSD_CHECKPOINTS], s2[WSD_CHECKPOINTS], 1.3, 0.5, 0.6, 0.2)
    fit, final = predict.fit_lr_annealing(WSD_CHECKPOINTS, loss, WSD)
    np.testing.assert_allclose([fit.params[k] for k in ("L0", "A", "alpha", "C")], [1.3, 0.5, 0.6, 0.2], rtol=1e-5)
    assert final == pytest.approx(loss[-1], abs=1e-7)


def test_gradnorm_window_is_the_mean_and_log_sd_of_the_observed_positive_norms():
    t = np.arange(0, 11)
    g = np.array([9.0, 1.0, np.e, np.nan, 0.0, np.e**2, 5.0, 5.0, 5.0, 5.0, 5.0])
    mean, spread = predict.gradnorm_window(t, g, cutoff=5)  # steps 1..5: 1, e, (nan), (0), e^2
    assert mean == pytest.approx((1 + np.e + np.e**2) / 3)
    assert spread == pytest.approx(1.0)  # ln = 0, 1, 2: sample SD 1
    assert np.isnan(predict.gradnorm_window(t, g, cutoff=1)).all()  # one norm: no spread, no number
