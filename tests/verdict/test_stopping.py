"""topometrics.verdict.stopping and the stopping_decisions view: hand-worked sweeps, a simulation with a known
answer, too-small sweeps."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

from tests.verdict.helpers import KINDS, _sweep
from topometrics.analysis import warehouse
from topometrics.verdict import stopping
from topometrics.verdict.intervals import CURRENT


def test_outcome_of_stopping_the_worst_quarter_and_half_of_four_runs():
    actual = np.array([1.0, 2.0, 3.0, 4.0])  # run 0 ends best
    predicted = np.array([3.5, 1.0, 2.0, 3.0])  # ranks the eventual best run worst
    steps = np.array([100, 100, 100, 300])
    quarter = stopping.outcome(predicted, actual, steps, np.zeros(4), 0.25, 0.2)
    assert quarter["killed"].tolist() == [True, False, False, False]
    assert quarter["saved"] == pytest.approx(0.8 * 100 / 600)
    assert quarter["best_killed"] == 1.0 and quarter["gap"] == pytest.approx(1.0)  # best kept: 2.0
    assert quarter["wrong"].tolist() == [True, False, False, False]  # run 3 should have gone
    half = stopping.outcome(predicted, actual, steps, np.zeros(4), 0.5, 0.2)
    assert half["killed"].tolist() == [True, False, False, True]
    assert half["saved"] == pytest.approx(0.8 * 400 / 600)
    assert half["wrong"].tolist() == [True, False, False, False]


def test_outcome_within_rungs_averages_the_rungs_and_skips_a_rung_too_small():
    actual = np.array([1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    predicted = np.array([1.0, 2.0, 3.0, 4.0, 4.0, 3.0, 2.0, 1.0, 0.0, 0.0])
    groups = np.array(["a"] * 4 + ["b"] * 4 + ["c"] * 2)  # rung c: 2 runs, stops none
    found = stopping.outcome(predicted, actual, np.ones(10), groups, 0.5, 0.5)
    assert found["killed"].tolist() == [False, False, True, True, True, True, False, False, False, False]
    assert found["best_killed"] == pytest.approx(0.5)  # rung a keeps its best, rung b stops it
    assert found["gap"] == pytest.approx((0.0 + 2.0) / 2)
    assert found["saved"] == pytest.approx(0.5 * 4 / 10)


def test_a_family_that_knows_the_final_loss_helps_decide_and_noise_does_not():
    table = stopping.decision_table(_sweep(0), KINDS, 0.2, "seed", stopping.Resampling(alpha=0.05, n_boot=40))
    sweep = table[(table["scope"] == "sweep") & (table["kill_share"] == 0.5)].set_index("predictor")
    assert sweep.loc["norm+oracle", "decision"] == "helps decide"
    assert sweep.loc["norm+oracle", "versus"] == CURRENT
    assert sweep.loc["norm+noise", "decision"] == "no evidence"
    assert sweep.loc[CURRENT, "decision"] == "baseline"
    # equal savings: the same 24 of 48 runs stopped after 20 % of their steps, whatever ranks them
    assert (sweep["killed"] == 24).all() and np.allclose(sweep["saved"], 0.5 * 0.8)
    assert sweep.loc["norm+oracle", "gap"] == pytest.approx(0.0)
    assert sweep.loc["norm+oracle", "wrong_kills"] < sweep.loc[CURRENT, "wrong_kills"]


def test_a_sweep_too_small_gets_a_row_that_says_how_many_runs_it_needs():
    small = _sweep(1).iloc[:3]
    table = stopping.decision_table(small, KINDS, 0.2, "seed", stopping.Resampling(alpha=0.05, n_boot=10))
    row = table[(table["scope"] == "sweep") & (table["predictor"] == CURRENT)].iloc[0]
    assert row["status"] == "skipped"
    assert row["reason"] == "3 runs; a 25% kill share needs at least 4 runs (train 1 more)"
    one_cell = _sweep(2).query("cell == 'r0|v0'")
    table = stopping.decision_table(one_cell, KINDS, 0.2, "seed", stopping.Resampling(0.05, n_boot=10))
    assert table["status"].eq("skipped").all()  # 4 runs, one cell: neither scope can resample cells
    assert table["reason"].str.endswith("need 2 rung x recipe cells").all()


def test_the_stopping_decisions_view_reads_the_table():
    con = duckdb.connect()
    schema, *views = warehouse.sql_files()
    con.execute(schema.read_text())
    table = stopping.decision_table(_sweep(3), KINDS, 0.3, "seed", stopping.Resampling(alpha=0.05, n_boot=10))
    con.register("frame", table)
    con.execute("INSERT INTO stopping SELECT * FROM frame")
    for view in views:
        con.execute(view.read_text())
    back = con.execute("SELECT * FROM stopping_decisions ORDER BY scope, kill_share, predictor").df()
    assert len(back) == len(table) == 2 * 3 * 3
    assert set(back["decision"]) <= {"helps decide", "no evidence", "baseline", "not enough cells"}


@pytest.mark.parametrize("scope_groups", [1, 3])
def test_the_bootstraps_at_once_equal_outcome_of_each_draw_to_the_bit(scope_groups):
    rng = np.random.default_rng(scope_groups)
    n = 40
    predicted = rng.integers(0, 6, n).astype(float)  # ties on purpose: the stable order decides them
    actual = rng.integers(0, 8, n) / 4.0
    steps = rng.choice([800.0, 1000.0], n)
    groups = rng.integers(0, scope_groups, n)
    groups[:2] = scope_groups  # a group of two runs: too few to stop any
    draws = [rng.integers(0, n, rng.integers(0, 50)) for _ in range(60)] + [np.arange(n)]
    matrix = stopping.draw_matrix(draws)
    matrix[rng.random(matrix.shape) < 0.1] = -1  # runs the predictor does not rank
    got = stopping.bootstrap_outcomes(predicted, actual, steps, groups, 0.5, 0.2, matrix)
    for i, row in enumerate(matrix):
        runs = row[row >= 0]
        want = stopping.outcome(predicted[runs], actual[runs], steps[runs], groups[runs], 0.5, 0.2)
        for key in ("saved", "best_killed", "gap"):
            assert np.array_equal(got[key][i], want[key], equal_nan=True), (i, key)
    assert np.isfinite(got["best_killed"]).sum() > 40 and np.isnan(got["saved"]).any()  # both cases met
    empty = stopping.bootstrap_outcomes(predicted, actual, steps, groups, 0.5, 0.2, np.full((3, 0), -1))
    assert all(np.isnan(v).all() and v.shape == (3,) for v in empty.values())
