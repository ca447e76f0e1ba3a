"""topometrics.analysis.verdict and the topology_verdict view: known answers on synthetic run sets, bad input."""

from __future__ import annotations

import dataclasses

import duckdb
import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from topometrics.analysis import verdict, warehouse
from topometrics.landscape.sublevel import SUMMARY_KEYS
from topometrics.params import AnalysisParams
from topometrics.vocabulary import verdict_families

FRACTIONS = (0.1, 0.3, 0.5)


def synthetic_runs(signal: str, seed: int = 0) -> pd.DataFrame:
    """36 runs (3 rungs x 4 seeds x 3 variants) x 3 fractions of model inputs with a known final loss.

    signal 'topology': the final loss depends on a scale-free feature independent of the norm;
    'norm': on the weight norm only (every topological input is a monotone function of the norm or noise).
    Fraction 0.1 observes only 3 checkpoints.
    """
    rng = np.random.default_rng(seed)
    rows = []
    runs = [(r, s, v) for r in ("a", "b", "c") for s in (1, 2, 3, 4) for v in ("x", "y", "z")]
    norm = rng.normal(0, 1, len(runs))
    topo = rng.normal(0, 1, len(runs))
    law = rng.normal(-0.3, 0.05, len(runs))
    for fraction in FRACTIONS:
        for i, (rung, s, variant) in enumerate(runs):
            anchor = 2.0 + 0.1 * rng.normal()
            hidden = {"topology": 0.3 * topo[i], "norm": 0.2 * norm[i]}[signal]
            actual = anchor + law[i] + hidden + rng.normal(0, 0.005)
            row = {"rung": rung, "seed": s, "variant": variant, "fraction": fraction, "actual": actual}
            row |= {"anchor": anchor, "n_seen": 3 if fraction == 0.1 else 12}
            row |= {"loss_drop": law[i] + rng.normal(0, 0.005), "mpl_drop": law[i] + rng.normal(0, 0.01)}
            row |= {"tissue_drop": np.nan if i % 3 == 0 else law[i]}  # fails in 1/3 of runs: not used
            row |= {"weight_norm_level": norm[i], "weight_norm_rate": rng.normal()}
            for columns in verdict.family_columns().values():
                for j, col in enumerate(columns):
                    row[col] = rng.normal() if j else np.exp(norm[i])  # a monotone function of the norm, or noise
            row["vr_unit_tp0_level"] = topo[i] if signal == "topology" else rng.normal()
            row["w_alpha_level"] = row["w_alpha_rate"] = row["rep_alpha_level"] = row["rep_alpha_rate"] = np.nan
            rows.append(row)
    return pd.DataFrame(rows)


def warehouse_with(table: pd.DataFrame, errors: pd.DataFrame, alpha: float = 0.05) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    schema, *views = warehouse.sql_files()
    con.execute(schema.read_text())
    settings = dataclasses.replace(AnalysisParams().settings(), alpha=alpha)
    values = list(settings.__dict__.values())
    con.execute(f"INSERT INTO settings VALUES ({', '.join('?' * len(values))})", values)
    for name, frame in (("incremental_validity", table), ("incremental_errors", errors)):
        con.register("frame", frame)
        con.execute(f"INSERT INTO {name} SELECT * FROM frame")
        con.unregister("frame")
    for view in views:
        con.execute(view.read_text())
    return con


def test_the_verdict_families_declared_in_the_vocabulary_in_report_order():
    assert list(verdict_families().items()) == [
        ("weights_np", ("np_norm", "np_sum", "np_shuffled_norm")),
        ("weights_vr", ("vr_tp0", "vr_tp1", "vr_entropy0", "vr_entropy1", "vr_count1", "vr_maxpers1")),
        (
            "scale_free",
            (
                "vr_unit_tp0", "vr_unit_tp1", "vr_unit_entropy0", "vr_unit_entropy1", "vr_unit_count1",
                "vr_unit_maxpers1", "vr_fnorm_tp0", "vr_fnorm_tp1", "vr_fnorm_entropy0", "vr_fnorm_entropy1",
                "vr_fnorm_count1", "vr_fnorm_maxpers1", "np_excess", "np_z",
            ),
        ),
        ("heavy_tail", ("w_alpha", "rep_alpha")),
        ("representation", ("rep_tp0", "rep_tp1", "rep_entropy0", "rep_entropy1", "rep_count1", "rep_maxpers1")),
        ("landscape", tuple(f"ls_{pair}_{key}" for pair in ("rand", "hess") for key in SUMMARY_KEYS)),
        ("curvature", ("hess_eig1", "hess_eig2", "hess_eig3", "hess_trace", "hess_eig1_over_trace")),
    ]  # fmt: skip
    assert [c[0] for c in verdict.comparisons()] == ["weight_norm", *verdict_families(), "everything"]


@pytest.fixture(scope="module")
def topology_case():
    table, errors = verdict.incremental_validity(synthetic_runs("topology"), n_boot=500, seed=0)
    return table, errors, warehouse_with(table, errors)


@pytest.fixture(scope="module")
def norm_case():
    table, errors = verdict.incremental_validity(synthetic_runs("norm", seed=1), n_boot=500, seed=0)
    return table, errors, warehouse_with(table, errors)


def words(con, cv, fraction):
    rows = con.execute(
        "SELECT family, verdict FROM topology_verdict WHERE cv = ? AND fraction = ?", [cv, fraction]
    ).fetchall()
    return dict(rows)


@pytest.mark.parametrize("cv", ["seed", "variant", "rung"])
def test_a_feature_independent_of_the_norm_adds(topology_case, cv):
    _, _, con = topology_case
    for fraction in (0.3, 0.5):
        got = words(con, cv, fraction)
        assert got["scale_free"] == "adds"
        assert got["weights_np"] == got["weights_vr"] == got["representation"] == "no evidence"
        assert got["everything"] in ("adds", "no evidence")  # the signal among ~80 noise inputs


@pytest.mark.parametrize("cv", ["seed", "variant"])
def test_a_loss_that_depends_only_on_the_norm_gives_no_evidence_for_topology(norm_case, cv):
    _, _, con = norm_case
    for fraction in (0.3, 0.5):
        got = words(con, cv, fraction)
        assert got["weight_norm"] == "adds"
        for family in ("weights_np", "weights_vr", "scale_free", "representation", "everything"):
            assert got[family] == "no evidence", family


def test_view_numbers_equal_a_direct_numpy_scipy_computation(topology_case):
    table, errors, con = topology_case
    view = con.execute("SELECT * FROM topology_verdict WHERE n_tests > 0").df()
    for r in view.itertuples():
        e = errors[(errors.cv == r.cv) & (errors.fraction == r.fraction) & (errors.family == r.family)]
        if r.verdict.startswith("skipped"):
            assert e.empty
            continue
        d = e["error_with"].to_numpy() - e["error_without"].to_numpy()
        assert r.n == len(e)
        assert r.delta_mae == pytest.approx(d.mean(), abs=1e-12)
        assert r.mae_with == pytest.approx(e["error_with"].mean(), abs=1e-12)
        assert np.abs(e["actual"] - e["predicted_with"]).to_numpy() == pytest.approx(e["error_with"].to_numpy())
        p = sps.wilcoxon(e["error_with"], e["error_without"]).pvalue
        m = table[(table.cv == r.cv) & (table.status == "ok") & table.p_value.notna()].shape[0]
        assert r.p_value == pytest.approx(p, rel=1e-12)
        assert r.p_bonferroni == pytest.approx(min(1.0, p * m), rel=1e-12) and r.n_tests == m
        boot = d[np.random.default_rng(0).integers(0, len(d), (500, len(d)))].mean(axis=1)
        assert (r.ci_low, r.ci_high) == pytest.approx(tuple(np.percentile(boot, [2.5, 97.5])), abs=1e-12)


def test_bad_input_is_a_named_skip_never_a_silent_nan(topology_case):
    table, _, con = topology_case
    skipped = table[table.status == "skipped"]
    assert skipped["reason"].notna().all()
    ok = table[table.status == "ok"]
    assert ok[["delta_mae", "ci_low", "ci_high", "p_value"]].notna().all().all()
    # a fraction with fewer than 4 checkpoints
    early = table[table.fraction == 0.1]
    assert (early.status == "skipped").all()
    assert early.reason.str.contains("observes at most 3 checkpoints per run; need 4").all()
    # a family with no usable values
    tail = table[(table.family == "heavy_tail") & (table.fraction == 0.3)]
    assert (tail.status == "skipped").all() and tail.reason.str.contains("family heavy_tail has no usable values").all()
    # an input that failed in too many runs is not used, and says so
    assert ok.reason.str.contains("not used .* tissue_drop", regex=True).all()
    words = con.execute("SELECT DISTINCT verdict FROM topology_verdict WHERE family = 'heavy_tail'").fetchall()
    assert all(w[0].startswith("skipped: ") for w in words)


def test_fewer_than_three_groups_and_a_missing_variant_column_are_named_skips():
    runs = synthetic_runs("topology")
    few = runs[runs.seed.isin([1, 2])].drop(columns="variant")
    table, errors = verdict.incremental_validity(few, n_boot=50)
    by_cv = table[table.fraction == 0.3].groupby("cv")["reason"].first()
    assert by_cv["seed"] == "leave-one-seed-out needs at least 3 seeds, got 2"
    assert by_cv["variant"] == "runs have no variant column (a single recipe)"
    assert (table[(table.cv == "rung") & (table.fraction == 0.3)].status == "ok").any()
    assert set(errors.variant.dropna()) == set()


def test_too_few_runs_for_bonferroni_is_not_enough_runs():
    runs = synthetic_runs("topology")
    small = runs[(runs.variant == "x") & runs.seed.isin([1, 2, 3]) & (runs.rung != "c")]  # 6 runs, 3 seeds
    table, errors = verdict.incremental_validity(small, n_boot=50)
    con = warehouse_with(table, errors)
    got = con.execute("SELECT DISTINCT verdict FROM topology_verdict WHERE cv = 'seed' AND n > 0").fetchall()
    assert {w[0] for w in got} == {"not enough runs (n=6)"}


def test_metrics_carry_the_headline_rows_words_and_numbers(topology_case):
    _, _, con = topology_case
    metrics = verdict.verdict_metrics(con.execute("SELECT * FROM topology_verdict").df())
    assert metrics["cv"] == "seed" and set(metrics) == {"cv", "f10", "f30", "f50"}  # the nearest runs first
    row = con.execute(
        "SELECT delta_mae, verdict, n FROM topology_verdict WHERE cv = 'seed' AND fraction = 0.5 AND family = ?",
        [verdict.HEADLINE_FAMILY],
    ).fetchone()
    assert metrics["f50"]["verdict"] == row[1] and metrics["f50"]["n"] == row[2] == 36
    assert metrics["f50"]["delta_mae"] == pytest.approx(row[0], rel=1e-5)
    assert metrics["f10"] == {"verdict": "skipped"}  # why: in the report and the view


def test_metrics_of_a_verdict_that_could_not_run_name_no_scheme():
    table, errors = verdict.incremental_validity(synthetic_runs("topology").query("fraction == 0.1"), n_boot=10)
    metrics = verdict.verdict_metrics(warehouse_with(table, errors).execute("SELECT * FROM topology_verdict").df())
    assert metrics == {"cv": "none", "f10": {"verdict": "skipped"}}
