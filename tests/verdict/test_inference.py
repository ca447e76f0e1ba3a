"""topometrics.verdict.inference: the verdict's fit, statistic, permutation p and bounds against independent
computations, and the regressions it guards (co-varying inputs, nominal rates, group-tuned penalties)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps
from sklearn.linear_model import Ridge
from sklearn.preprocessing import StandardScaler

from bench import power
from tests.repo_params import analysis_params
from topometrics.verdict import inference, verdict


def test_a_covarying_input_is_not_attenuated():
    # x2 = 0.8 x1 + 0.6 u, y = x1 + x2: a second ridge on raw x2 shrank its coefficient (MAE 0.39 where one
    # joint fit gives 0.04); orthogonalised on the base inside each fold it keeps its full weight
    rng = np.random.default_rng(0)
    x1, u = rng.normal(size=32), rng.normal(size=32)
    x2 = 0.8 * x1 + 0.6 * u
    y = x1 + x2 + 0.05 * rng.normal(size=32)
    out = inference.nested_cross_validate(x1[:, None], x2[:, None], y, np.repeat(np.arange(4), 8))
    assert np.mean(np.abs(out["without"] - y)) > 0.4
    assert np.mean(np.abs(out["with"] - y)) < 0.08


def test_orthogonalise_leaves_the_part_a_least_squares_fit_on_the_base_cannot_explain():
    rng = np.random.default_rng(1)
    base, extra = rng.normal(size=(20, 2)), rng.normal(size=(20, 3))
    train = np.arange(20) < 15
    ortho = inference.orthogonalise(extra, np.column_stack([np.ones(20), base]), train)
    design = np.column_stack([np.ones(15), base[train]])
    assert np.abs(design.T @ ortho[train]).max() < 1e-10  # orthogonal to [1, base] on the training rows
    coef = np.linalg.lstsq(design, extra[train], rcond=None)[0]
    assert ortho[~train] == pytest.approx(extra[~train] - np.column_stack([np.ones(5), base[~train]]) @ coef)


def test_penalties_are_tuned_leave_one_group_out_not_leave_one_run_out():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(24, 3))
    groups = np.repeat(np.arange(4), 6)
    y = x @ [1.0, 0.0, 0.5] + rng.normal(0, 1, 4)[groups] + 0.3 * rng.normal(size=24)
    new = rng.normal(size=(5, 3))
    got = inference.ridge_predict(x, y, new, inference.BASE_ALPHAS, groups)
    sse = []  # brute force: sklearn's Ridge on standardised inputs, every penalty, every held-out group
    for alpha in inference.BASE_ALPHAS:
        err = 0.0
        for g in range(4):
            scaler = StandardScaler().fit(x[groups != g])
            model = Ridge(alpha=alpha).fit(scaler.transform(x[groups != g]), y[groups != g])
            err += np.sum((model.predict(scaler.transform(x[groups == g])) - y[groups == g]) ** 2)
        sse.append(err)
    best = inference.BASE_ALPHAS[int(np.argmin(sse))]
    scaler = StandardScaler().fit(x)
    assert got == pytest.approx(Ridge(alpha=best).fit(scaler.transform(x), y).predict(scaler.transform(new)))


def test_clark_west_is_the_adjusted_mse_difference():
    rng = np.random.default_rng(3)
    y, a, b = rng.normal(size=(3, 40))
    adjusted = np.mean((y - a) ** 2 - ((y - b) ** 2 - (a - b) ** 2))
    assert inference.clark_west(y, a, b) == pytest.approx(adjusted, rel=1e-12)


def test_a_cell_permutation_moves_whole_cells_within_their_rung_and_keeps_seeds():
    rungs = np.repeat(["a", "b"], 12)
    cells = np.repeat(np.arange(6), 4)
    seeds = np.tile(np.arange(4), 6)
    index = inference.cell_permutation(rungs, cells, seeds, np.random.default_rng(0))
    assert (rungs[index] == rungs).all() and (seeds[index] == seeds).all()
    moved = pd.DataFrame({"cell": cells, "source": cells[index]}).groupby("cell")["source"].nunique()
    assert (moved == 1).all()  # a cell's runs all come from one source cell
    assert sorted(cells[index]) == sorted(cells)


def test_cell_bounds_are_a_one_sided_t_interval_over_cell_means():
    rng = np.random.default_rng(4)
    d, cells = rng.normal(size=30), np.repeat(np.arange(6), 5)
    mean, low, high, n = inference.cell_bounds(d, cells)
    means = d.reshape(6, 5).mean(axis=1)
    half = sps.t.ppf(0.95, 5) * sps.sem(means)
    assert (mean, low, high, n) == pytest.approx((d.mean(), d.mean() - half, d.mean() + half, 6))


def _null_rejections(family: str, reps: int, n_perm: int = 19) -> np.ndarray:
    """p-values of the test on ``reps`` simulated 32-run sweeps whose family adds nothing."""
    ps = []
    for rep in range(reps):
        runs = power.simulate((2, 4, 4), 3, 0.0, "noise", np.random.default_rng([11, rep]))
        extra = runs.extra
        if family == "cell marker":  # constant within each rung x recipe cell, unrelated to the loss
            extra = np.random.default_rng([12, rep]).normal(size=(8, 2))[runs.rung * 4 + runs.recipe]
        cells = runs.rung * 4 + runs.recipe
        labels = inference.RunLabels(runs.seed, runs.rung, cells, runs.seed)
        test = inference.family_test(runs.base, extra, runs.y, labels, inference.Refits(n_perm, rep))
        ps.append(test.p_value)
    return np.array(ps)


def test_an_exchangeable_null_is_rejected_at_its_nominal_rate():
    # a permutation p of a family exchangeable with its permutations is uniform on {1/20, ..., 1}: at 0.2,
    # 50 run sets reject 10 +- 2.8; the old Wilcoxon over dependent runs rejected a symmetric null 4-9 % at 5 %
    p = _null_rejections("noise", 50)
    assert 3 <= np.sum(p <= 0.2) <= 18


def test_a_cell_marking_family_under_leave_one_seed_out_does_not_over_reject():
    # a family that only marks cells learns their error from the other seeds; run-level permutations of it
    # rejected 8-10 % at 5 %, cell-block permutations hold the level
    p = _null_rejections("cell marker", 50)
    assert np.sum(p <= 0.2) <= 18


def test_a_1e7_difference_is_never_adds():
    row = {"n": 96, "n_cells": 12, "min_p": 0.01, "gain_share": 1e-7 / 0.05, "ci_low": -2e-7, "bound_share": 4e-6}
    assert verdict.word(row, 0.002, 0.05, 0.05, 0.01) == "ruled out (> 0.0 %)"
    assert verdict.word(row | {"bound_share": 0.2}, 0.002, 0.05, 0.05, 0.01) == "no evidence"
    assert verdict.word(row | {"gain_share": 0.02}, 0.002, 0.05, 0.05, 0.01) == "adds"
    # worse predictions alone are what a useless family earns: 'hurts' needs the reverse test too
    assert verdict.word(row | {"ci_low": 1e-3}, 0.5, 0.05, 0.05, 0.01) == "no evidence"
    assert verdict.word(row | {"ci_low": 1e-3, "p_reverse": 0.3}, 0.5, 0.05, 0.05, 0.01) == "no evidence"
    assert verdict.word(row | {"ci_low": 1e-3, "p_reverse": 0.01}, 0.5, 0.05, 0.05, 0.01) == "hurts"
    assert verdict.word(row | {"min_p": 0.05}, 0.002, 0.05, 0.05, 0.01).startswith("not enough runs")


def test_holm_matches_a_hand_worked_case():
    got = inference.holm([0.01, 0.04, np.nan, 0.03, 0.2])
    # sorted 0.01, 0.03, 0.04, 0.2 (m = 4): 0.04, 0.09, max(0.09, 0.08), 0.2
    assert got[[0, 3, 1, 4]] == pytest.approx([0.04, 0.09, 0.09, 0.2]) and np.isnan(got[2])


def test_only_topology_questions_are_corrected_together():
    frame = pd.DataFrame(
        {"cv": "seed", "role": ["primary", "context", "topology", "topology", "context", "topology"]}
        | {"p_value": [0.01, 0.01, 0.01, 0.02, 0.01, 0.5], "status": "ok", "reason": None}
        | {"n": 96, "n_cells": 12, "min_p": 0.001, "gain_share": 0.1, "ci_low": -0.01, "bound_share": 0.2}
    )
    out = verdict.judge(frame, analysis_params())
    assert out["p_adjusted"].tolist() == pytest.approx([0.01, 0.01, 0.03, 0.04, 0.01, 0.5])
    assert out["verdict"].tolist() == ["adds", "adds", "adds", "adds", "adds", "no evidence"]


def test_the_bench_machinery_reports_rates_for_every_cv_and_family_on_a_small_case():
    table = power.rates((2, 4, 3), ["seed", "variant"], k=1, reps=2, n_perm=19)
    assert set(table) == {
        f"{cv}/{f}"
        for cv in ("seed", "variant")
        for f in ("noise", "nuisance", "recipe proxy", "s=0.1", "s=0.3", "s=0.5")
    }
    assert all(0 <= v["adds_pct"] <= 100 and v["reps"] == 2 for v in table.values())
    runs = power.simulate((3, 4, 2), 2, 0.5, "signal", np.random.default_rng(0))
    assert (
        runs.base.shape == (24, 10)
        and runs.extra.shape == (24, 4)
        and len(set(zip(runs.rung, runs.recipe, strict=True))) == 12
    )
    cal = power.calibration((2, 4, 4), reps=3)
    assert 0.07 < cal["mae_loss_curve"] < 0.14 and cal["mae_with_norm"] < cal["mae_loss_curve"]


def test_the_seeds_needed_are_the_fewest_whose_simulated_power_reaches_the_target():
    got = power.seeds_needed((3, 4, 2), "seed", k=1, target=60, reps=10, n_perm=39, most=3)
    seeds = int(got["layout"].split("x")[2])  # the simulations are seeded: every probe is reproducible by power_at
    assert 2 < seeds <= 6 and got["runs"] == 12 * seeds and got["power"] >= 60
    assert power.power_at((3, 4, seeds - 1), "seed", 1, 10, 39) < 60  # one seed fewer falls short
    unreachable = power.seeds_needed((2, 4, 2), "seed", k=1, target=101, reps=2, n_perm=19, most=2)
    assert unreachable["layout"] is None and unreachable["tried_seeds"] == 4


def test_the_base_model_is_chosen_inside_each_training_fold_among_the_candidates():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(30, 3))
    y = 2 * x[:, 1] + 0.01 * rng.normal(size=30)  # only the second column predicts
    groups = np.repeat(np.arange(5), 6)
    chosen = inference.base_folds(x, y, groups, candidates=[[0], [1], [2], []])
    assert np.mean(np.abs(chosen.without - y)) < 0.05
    assert all(design.shape[1] == 2 and np.allclose(design[:, 1], x[:, 1]) for *_, design in chosen.folds)
    mean_only = inference.base_folds(x, y, groups, candidates=[[]])
    assert np.mean(np.abs(mean_only.without - y)) > 1.0
    assert verdict.base_candidates(["loss_drop", "mpl_drop", "weight_norm_level"]) == [[0, 2], [1, 2], [2]]


def _cell_sweep(seed: int, signal: float) -> tuple:
    """3 rungs x 4 recipes x 8 seeds: a base, a 4-column family that marks cells (plus ``signal`` in y)."""
    rng = np.random.default_rng(seed)
    rungs, cells = np.repeat(np.arange(3), 32), np.repeat(np.arange(12), 8)
    seeds = np.tile(np.arange(8), 12)
    base = rng.normal(size=(96, 3)) + rungs[:, None]
    cell = rng.normal(size=12)[cells]
    extra = rng.normal(size=(96, 4)) + 0.5 * cell[:, None]
    y = base @ [0.5, 0.2, 0.1] + cell + 0.1 * rng.normal(size=96) + signal * extra[:, 0]
    return base, extra, y, rungs, cells, seeds


@pytest.mark.parametrize("cv", ["seed", "recipe", "rung"])
def test_refits_fitted_as_a_stack_equal_refits_fitted_one_at_a_time(cv):
    base, extra, y, rungs, cells, seeds = _cell_sweep(1, 0.3)
    groups = {"seed": seeds, "recipe": cells % 4, "rung": rungs}[cv]
    folds = inference.base_folds(base, y, groups)
    rng = np.random.default_rng(2)
    orders = np.array([inference.cell_permutation(rungs, cells, seeds, rng) for _ in range(12)])
    one = np.array([inference.with_family(folds, extra[order], groups) for order in orders])
    stacked = inference.with_family(folds, extra[orders], groups)
    assert np.array_equal(np.isfinite(one), np.isfinite(stacked))
    finite = np.isfinite(one)
    np.testing.assert_allclose(stacked[finite], one[finite], rtol=1e-9, atol=0)


@pytest.mark.parametrize(("signal", "stop"), [(0.0, 0), (0.0, 10), (1.0, 0), (1.0, 10)])
def test_the_stacked_refits_give_the_p_of_refits_counted_one_at_a_time(signal, stop):
    # the loop the stacks replace, written out: the same draws in the same order, stopping at the same refit
    base, extra, y, rungs, cells, seeds = _cell_sweep(3, signal)
    labels = inference.RunLabels(seeds, rungs, cells, seeds)
    got = inference.family_test(base, extra, y, labels, inference.Refits(99, 5, stop))
    folds = inference.base_folds(base, y, seeds)
    observed = inference.clark_west(y, folds.without, inference.with_family(folds, extra, seeds))
    tie = inference.TIE * np.mean((y - folds.without) ** 2)
    rng, hits, low, done = np.random.default_rng(5), 0, 0, 0
    while done < 99 and not (stop and hits >= stop and low >= stop):
        order = inference.cell_permutation(rungs, cells, seeds, rng)
        moved = inference.clark_west(y, folds.without, inference.with_family(folds, extra[order], seeds))
        hits, low, done = hits + (moved >= observed - tie), low + (moved <= observed + tie), done + 1
    stopped = stop and hits >= stop and low >= stop
    p, reverse = (hits / done, low / done) if stopped else ((1 + hits) / (1 + done), (1 + low) / (1 + done))
    assert (got.statistic, got.n_perm, got.p_value, got.p_reverse) == (observed, done, p, reverse)


def test_base_folds_are_fitted_once_for_the_same_base_target_and_groups():
    base, _, y, _, cells, seeds = _cell_sweep(4, 0.0)
    first = inference.shared_base_folds(base, y, seeds)
    again = inference.shared_base_folds(base.copy(), y.copy(), list(seeds))  # equal values, other objects
    assert again is first
    np.testing.assert_array_equal(first.without, inference.base_folds(base, y, seeds).without)
    assert inference.shared_base_folds(base, y + 1.0, seeds) is not first
    assert inference.shared_base_folds(base, y, cells % 4) is not first
    assert inference.shared_base_folds(base, y, seeds, candidates=[[0], [1, 2]]) is not first


@pytest.mark.parametrize("seed", range(6))
def test_an_identity_refit_ties_with_the_observed_statistic(seed):
    # the refits' stacked route differs from the observed statistic's by rounding; far less than the tie
    base, extra, y, _, cells, seeds = _cell_sweep(seed, 0.5 * (seed % 3))
    for groups in (seeds, cells % 4):
        folds = inference.base_folds(base, y, groups)
        observed = inference.clark_west(y, folds.without, inference.with_family(folds, extra, groups))
        identity = inference.clark_west(y, folds.without, inference.with_family(folds, extra[None], groups)[0])
        assert abs(identity - observed) <= 1e-3 * inference.TIE * np.nanmean((y - folds.without) ** 2)
