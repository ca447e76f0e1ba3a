"""topometrics.verdict.intervals and the interval_coverage view: hand-worked ranks, coverage on a simulation
with a known answer, the predictors' names."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from topometrics.verdict import intervals


def test_half_width_is_the_conformal_rank_of_the_other_folds_residuals():
    residuals = np.array([0.1, -0.2, 0.3, -0.4, 0.5, 9.0])
    folds = np.array(["a", "b", "c", "d", "e", "f"])
    # run 'a': the others are 0.2, 0.3, 0.4, 0.5, 9.0 (m = 5); level 0.5: rank ceil(0.5 * 6) = 3 -> 0.4
    assert intervals.conformal_half_widths(residuals, folds, 0.5)[0] == pytest.approx(0.4)
    # level 0.8: rank ceil(0.8 * 6) = 5 -> 9.0 for 'a'; for 'f' the others are 0.1 .. 0.5 -> 0.5
    widths = intervals.conformal_half_widths(residuals, folds, 0.8)
    assert widths[0] == pytest.approx(9.0) and widths[5] == pytest.approx(0.5)
    # level 0.95: rank ceil(0.95 * 6) = 6 > 5 runs: no finite interval
    assert np.isinf(intervals.conformal_half_widths(residuals, folds, 0.95)).all()


def test_a_runs_own_fold_never_calibrates_its_interval():
    residuals = np.array([100.0, 100.0, 0.1, 0.2, 0.3, 0.4])
    folds = np.array([0, 0, 1, 1, 2, 2])
    # fold 0's two huge residuals calibrate the others, never themselves: rank ceil(0.5 * 5) = 3 of the 4 others
    widths = intervals.conformal_half_widths(residuals, folds, 0.5)
    assert widths[0] == pytest.approx(0.3)
    assert widths[2] == pytest.approx(100.0)


def _leave_one_group_out(x, y, groups):
    """Out-of-fold least-squares predictions (an independent model of the verdict's kind)."""
    design = np.column_stack([np.ones(len(y)), x])
    out = np.empty(len(y))
    for g in np.unique(groups):
        test = groups == g
        coef, *_ = np.linalg.lstsq(design[~test], y[~test], rcond=None)
        out[test] = design[test] @ coef
    return out


def test_measured_coverage_matches_the_nominal_on_exchangeable_runs():
    # known answer: y = 1 + 2 x + N(0, 0.1); 12 seeds x 4 runs, left out a seed at a time, 60 simulated sweeps
    rng = np.random.default_rng(0)
    hits = {level: [] for level in intervals.LEVELS}
    for _ in range(60):
        groups = np.repeat(np.arange(12), 4)
        x = rng.normal(size=48)
        y = 1 + 2 * x + rng.normal(0, 0.1, 48)
        residual = y - _leave_one_group_out(x, y, groups)
        for level in intervals.LEVELS:
            half = intervals.conformal_half_widths(residual, groups, level)
            hits[level] += list(np.abs(residual) <= half)
    for level in intervals.LEVELS:  # 2,880 intervals: the binomial SD of the share is <= 0.0075
        assert np.mean(hits[level]) == pytest.approx(level, abs=0.025)
    # and the 95 % half-width is about 1.96 noise SDs (the intervals are not simply wide)
    assert np.median(intervals.conformal_half_widths(residual, groups, 0.95)) == pytest.approx(0.196, rel=0.25)


def test_predictors_are_named_by_the_verdicts_baselines_and_families():
    keys = {"cv": "seed", "fraction": 0.5}
    validity = pd.DataFrame([
        keys | {"family": "weight_norm", "comparison": "(2) vs (1)", "baseline": "loss"},
        keys | {"family": "weights_vr", "comparison": "(3) vs norm", "baseline": "norm"},
        keys | {"family": "weights_vr", "comparison": "(3) vs norm+curvature", "baseline": "norm+curvature"},
        keys | {"family": "weights_vr", "comparison": "(3) vs recipe", "baseline": "recipe"},
        keys | {"family": "scale_free", "comparison": "(3) vs recipe", "baseline": "recipe"},  # the same label
    ])  # fmt: skip
    runs = [{"rung": "a", "seed": s, "variant": "base", "actual": 2.0 + s / 10} for s in range(1, 4)]
    errors = pd.DataFrame([
        keys | r | {"family": v["family"], "comparison": v["comparison"], "predicted_without": 2.0,
                    "predicted_with": 2.1}
        for _, v in validity.iterrows() for r in runs
    ])  # fmt: skip
    found = intervals.predictors(errors, validity)
    names = found.groupby("predictor")["kind"].first().to_dict()
    assert names == {"loss": "baseline", "norm": "baseline", "norm+curvature": "baseline",
                     "norm+weights_vr": "family", "norm+curvature+weights_vr": "family",
                     "recipe": "baseline", "recipe+weights_vr": "family", "recipe+scale_free": "family"}  # fmt: skip
    # 'norm' is met in two comparisons, 'recipe' in two labelled '(3) vs recipe': one set of runs each
    assert (found.groupby("predictor").size() == 3).all()
    assert set(found["fold"]) == {"1", "2", "3"}  # leave-one-seed-out: the fold is the seed
    assert set(found["level"]) == {"between"}


def test_interval_table_marks_coverage_and_leaves_infinite_intervals_uncounted():
    predicted = pd.DataFrame({
        "cv": "seed", "level": "between", "fraction": 0.5, "predictor": "norm", "kind": "baseline", "rung": "a",
        "seed": range(5), "variant": "base", "fold": [str(i) for i in range(5)],
        "actual": [1.0, 1.0, 1.0, 1.0, 1.0], "predicted": [1.1, 0.8, 1.3, 0.6, 1.05],
    })  # fmt: skip
    table = intervals.interval_table(predicted)
    at80 = table[table["nominal"] == 0.8]
    # rank ceil(0.8 * 5) = 4 of the 4 others: the largest other |residual|; run 3 (0.4 off) gets 0.3 -> missed
    assert at80["half_width"].tolist() == pytest.approx([0.4, 0.4, 0.4, 0.3, 0.4])
    assert at80["covered"].tolist() == [1.0, 1.0, 1.0, 0.0, 1.0]
    assert table[table["nominal"] == 0.95]["covered"].isna().all()  # rank 5 of 4: infinite, not counted
