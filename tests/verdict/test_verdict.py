"""topometrics.verdict.verdict and the topology_verdict view: known answers on synthetic run sets, bad input."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from tests.repo_params import analysis_params
from tests.verdict.helpers import synthetic_runs, warehouse_with
from topometrics.execution import compute
from topometrics.landscape.sublevel import SUMMARY_KEYS
from topometrics.params import ParamsError, PrimaryParams
from topometrics.verdict import inference, remedy, verdict
from topometrics.vocabulary import verdict_families

GT_KEYS = ("tp0", "tp1", "entropy0", "entropy1", "count1", "maxpers1")  # the gt_ names, noise scale and cosine out


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
        (
            "gradient_topology",
            tuple(f"gt_{unit}{key}" for unit in ("", "unit_") for key in GT_KEYS)
            + tuple(f"gt_net_{unit}{key}" for unit in ("", "unit_") for key in GT_KEYS),
        ),
        ("trajectory", ("traj_phdim", "traj_ckpt_phdim")),
        ("changepoints", ("cp_count", "cp_first")),
    ]  # fmt: skip
    # a run-level summary (the changepoints by the cutoff) enters as itself: it has no level and rate
    assert verdict.family_columns()["changepoints"] == ("cp_count", "cp_first")
    assert verdict.family_columns()["trajectory"] == ("traj_phdim_level", "traj_phdim_rate") + (
        "traj_ckpt_phdim_level", "traj_ckpt_phdim_rate")  # fmt: skip
    # a loss slice's range and basin share are geometric, its bars topological: the landscape family is mixed
    topological = [f for f in verdict_families() if f not in ("heavy_tail", "landscape", "curvature")]
    # the recipe baseline (loss curve + norm + recipe) is every topology row's; + curvature its second; the old
    # norm baselines stay as context rows, and so do the recipe over the norm and the other families
    assert [(c["family"], c["baseline"]) for c in verdict.comparisons()] == [
        ("weight_norm", "loss"), ("recipe", "norm"), ("heavy_tail", "recipe"), ("landscape", "recipe"),
        ("curvature", "recipe"), *((f, "recipe") for f in topological), *((f, "recipe+curvature") for f in topological),
        *((f, "norm") for f in topological), *((f, "norm+curvature") for f in topological), ("everything", "recipe"),
    ]  # fmt: skip
    roles = {(c["family"], c["baseline"]): c["role"] for c in verdict.comparisons() if c["family"] in topological}
    assert {r for (f, b), r in roles.items() if b.startswith("recipe")} == {"topology"}
    assert {r for (f, b), r in roles.items() if b.startswith("norm")} == {"context"}


FAMILIES = {"scale_free": ("vr_unit_tp0",), "weights_vr": ("vr_tp0", "vr_tp1"), "heavy_tail": ("w_alpha", "rep_alpha")}
PRIMARY = PrimaryParams(family="scale_free", fraction=0.5, cv="seed", features=("vr_unit_tp0",))
PARAMS = analysis_params(primary=PRIMARY, permutations=49)


@pytest.fixture(scope="module")
def topology_case():
    runs = synthetic_runs("topology").query("fraction != 0.3")  # 2 topology rows per scheme: Holm level 0.025
    table, errors = verdict.incremental_validity(runs, PARAMS, FAMILIES)
    return table, errors, warehouse_with(table, errors)


@pytest.fixture(scope="module")
def norm_case():
    runs = synthetic_runs("norm", seed=1).query("fraction != 0.3")
    table, errors = verdict.incremental_validity(runs, PARAMS, FAMILIES)
    return table, errors, warehouse_with(table, errors)


def words(con, cv, fraction, role="'topology', 'context'"):
    rows = con.execute(
        f"SELECT family, verdict FROM topology_verdict WHERE cv = ? AND fraction = ? AND role IN ({role})",
        [cv, fraction],
    ).fetchall()
    return dict(rows)


@pytest.mark.parametrize("cv", ["seed", "variant", "rung"])
def test_a_feature_independent_of_the_norm_adds(topology_case, cv):
    _, _, con = topology_case
    for fraction in (0.5,):
        got = words(con, cv, fraction)
        assert got["scale_free"] == "adds"
        assert not got["weights_vr"].startswith(("adds", "skipped"))
    assert words(con, "seed", 0.5, "'primary'") == {"scale_free": "adds"}


@pytest.mark.parametrize("cv", ["seed", "variant"])
def test_a_loss_that_depends_only_on_the_norm_gives_no_evidence_for_topology(norm_case, cv):
    _, _, con = norm_case
    for fraction in (0.5,):
        got = words(con, cv, fraction)
        assert got["weight_norm"] == "adds"
        for family in ("weights_vr", "scale_free", "everything"):
            assert got[family] in ("no evidence", "hurts") or got[family].startswith("ruled out"), family


def test_view_numbers_equal_a_direct_numpy_scipy_computation(topology_case):
    table, errors, con = topology_case
    view = con.execute("SELECT * FROM topology_verdict").df()
    for r in view.itertuples():
        e = errors[(errors.cv == r.cv) & (errors.fraction == r.fraction) & (errors.comparison == r.comparison)]
        e = e[(e.family == r.family) & (e.level == r.level)]
        if r.verdict.startswith("skipped"):
            continue
        d = e["error_with"].to_numpy() - e["error_without"].to_numpy()
        assert r.n == len(e)
        assert r.delta_mae == pytest.approx(d.mean(), abs=1e-12)
        assert r.mae_with == pytest.approx(e["error_with"].mean(), abs=1e-12)
        cells = (e["rung"] + e["variant"]).to_numpy()
        means = np.array([d[cells == c].mean() for c in np.unique(cells)])
        half = sps.t.ppf(0.95, len(means) - 1) * sps.sem(means)
        assert (r.ci_low, r.ci_high) == pytest.approx((d.mean() - half, d.mean() + half), abs=1e-12)
        assert r.bound_share == pytest.approx(-(d.mean() - half) / e["error_without"].mean(), rel=1e-9)
        assert r.mae_without_sd == pytest.approx(r.mae_without / r.seed_sd, rel=1e-12)
        actual, y_hat, within = e["actual"].to_numpy(), e["predicted_with"].to_numpy(), r.level == "within"
        # between: pairs of different cells (which recipe/size ends better); within: pairs of one cell
        pairs = [(i, j) for i in range(len(e)) for j in range(i + 1, len(e)) if (cells[i] == cells[j]) == within]
        right = np.mean([np.sign(y_hat[i] - y_hat[j]) == np.sign(actual[i] - actual[j]) for i, j in pairs])
        assert r.decision_with == pytest.approx(right, abs=1e-12)


def test_bad_input_is_a_named_skip_never_a_silent_nan(topology_case):
    table, _, con = topology_case
    skipped = table[table.status == "skipped"]
    assert skipped["reason"].notna().all()
    ok = table[table.status == "ok"]
    assert ok[["delta_mae", "ci_low", "ci_high", "p_value", "verdict"]].notna().all().all()
    early = table[table.fraction == 0.1]
    assert (early.status == "skipped").all()
    assert early.reason.str.contains("observes at most 3 checkpoints per run; need 4").all()
    tail = table[(table.family == "heavy_tail") & (table.fraction == 0.5)]
    assert (tail.status == "skipped").all() and tail.reason.str.contains("family heavy_tail has no usable values").all()
    assert ok.reason.str.contains("not used .* tissue_drop", regex=True).all()
    words = con.execute("SELECT DISTINCT verdict FROM topology_verdict WHERE family = 'heavy_tail'").fetchall()
    assert all(w[0].startswith("skipped: ") for w in words)


def test_fewer_than_three_groups_and_a_missing_variant_column_are_named_skips():
    runs = synthetic_runs("topology")
    few = runs[runs.seed.isin([1, 2])].drop(columns="variant")
    table, errors = verdict.incremental_validity(few, analysis_params(permutations=9), FAMILIES)
    by_cv = table[table.fraction == 0.3].groupby("cv")["reason"].first()
    assert by_cv["seed"] == "leave-one-seed-out needs at least 3 seeds, got 2"
    assert by_cv["variant"] == "runs have no variant column (a single recipe)"
    assert (table[(table.cv == "rung") & (table.fraction == 0.3)].status == "ok").any()
    assert set(errors.variant.dropna()) == set()


def test_the_not_enough_runs_rule_counts_usable_cells():
    runs = synthetic_runs("topology")
    one_recipe = runs[runs.variant == "x"]  # 12 runs, 3 cells, one per rung: no cell permutation exists
    table, _ = verdict.incremental_validity(one_recipe, analysis_params(permutations=9), FAMILIES)
    tested = table[(table.cv == "seed") & (table.status == "ok") & (table.level == "between")]
    assert (tested.min_p == 1.0).all() and tested.verdict.str.startswith("not enough runs (n=12, 3 cells)").all()
    # a cell whose runs lack the family's values does not count: 2 usable cells in rung a -> 2! = 2 permutations
    rungs, cells = np.array(["a"] * 6 + ["b"] * 3), np.array([0, 0, 1, 1, 2, 2, 3, 3, 3])
    assert (
        inference.distinct_permutations(rungs, cells) == 6
        and inference.distinct_permutations(rungs[2:], cells[2:]) == 2
    )
    assert remedy.recipes_needed(3, 0.05, 99) == 3 and remedy.recipes_needed(3, 0.05, 9) is None


def test_metrics_lead_with_the_primary_endpoint(topology_case):
    _, _, con = topology_case
    metrics = verdict.verdict_metrics(con.execute("SELECT * FROM topology_verdict").df())
    assert metrics["cv"] == "seed" and set(metrics) == {"primary", "cv", "f10", "f50"}
    primary = metrics["primary"]
    assert (primary["family"], primary["fraction"], primary["verdict"], primary["n"]) == ("scale_free", 0.5, "adds", 36)
    row = con.execute(
        "SELECT delta_mae, verdict, n FROM topology_verdict WHERE cv = 'seed' AND fraction = 0.5 AND family = ?",
        [verdict.HEADLINE_FAMILY],
    ).fetchone()
    assert metrics["f50"]["verdict"] == row[1] and metrics["f50"]["n"] == row[2] == 36
    assert metrics["f10"] == {"verdict": "skipped"}


def test_metrics_of_a_verdict_that_could_not_run_name_no_scheme():
    skipped = synthetic_runs("topology").query("fraction == 0.1")
    table, errors = verdict.incremental_validity(skipped, analysis_params(), FAMILIES)
    metrics = verdict.verdict_metrics(warehouse_with(table, errors).execute("SELECT * FROM topology_verdict").df())
    assert metrics == {"cv": "none", "f10": {"verdict": "skipped"}}


@pytest.mark.parametrize(
    ("primary", "message"),
    [
        (PrimaryParams("topo", 0.5, "seed"), "family 'topo' is not a verdict family"),
        (PrimaryParams("weights_vr", 0.5, "seed"), "weights_vr has > 3 features"),
        (PrimaryParams("weights_vr", 0.5, "seed", ("np_norm",)), r"\['np_norm'\] not all in weights_vr"),
        (PrimaryParams("scale_free", 0.5, "seed", ("np_z",), baseline="norm+landscape"), "baseline 'norm.landscape"),
    ],
)
def test_a_primary_endpoint_not_in_the_vocabulary_is_one_params_error_before_any_comparison(primary, message):
    with pytest.raises(ParamsError, match=message):
        verdict.incremental_validity(synthetic_runs("topology"), analysis_params(primary=primary))


def test_a_primary_endpoint_reading_a_family_the_features_stage_leaves_out_is_a_params_error():
    everything = ("np", "vr", "spectral", "scale_free", "landscape", "curvature", "trajectory")
    on_landscape = PrimaryParams("landscape", 0.3, "seed", ("ls_hess_tp",), baseline="norm+curvature")
    verdict.check_primary(analysis_params(primary=on_landscape), computed=everything)  # all computed: no error
    with pytest.raises(ParamsError, match=r"reads the families \['curvature'\], which features.families leaves out"):
        verdict.check_primary(analysis_params(primary=on_landscape), computed=("landscape", "vr"))
    with pytest.raises(ParamsError, match=r"reads the families \['landscape'\]"):
        verdict.check_primary(analysis_params(primary=dataclasses.replace(on_landscape, baseline="norm")), computed=())
    # the changepoint family is the analysis's own: no features-stage family to switch on
    on_changes = PrimaryParams("changepoints", 0.3, "seed")
    verdict.check_primary(analysis_params(primary=on_changes), computed=())


def test_a_geometric_family_becomes_a_second_baseline_for_every_topological_family():
    families = {"weights_vr": ("vr_tp0",), "scale_free": ("vr_unit_tp0",), "norms": ("w_fro",)}
    with pytest.MonkeyPatch.context() as patch:  # w_fro stands in for a declared geometric feature
        patch.setattr(verdict, "kind", lambda f: "geometric" if f == "w_fro" else "topological")
        plan = verdict.comparisons(families)
        assert list(verdict.baselines(families)) == ["recipe", "recipe+norms", "norm", "norm+norms"]
    got = [(c["family"], c["baseline"], c["role"]) for c in plan]
    assert got == [
        ("weight_norm", "loss", "context"), ("recipe", "norm", "context"), ("norms", "recipe", "context"),
        ("weights_vr", "recipe", "topology"), ("scale_free", "recipe", "topology"),
        ("weights_vr", "recipe+norms", "topology"), ("scale_free", "recipe+norms", "topology"),
        ("weights_vr", "norm", "context"), ("scale_free", "norm", "context"),
        ("weights_vr", "norm+norms", "context"), ("scale_free", "norm+norms", "context"),
        ("everything", "recipe", "context"),
    ]  # fmt: skip
    recipe = (*verdict.LOSS_INPUTS, *verdict.NORM_INPUTS, *verdict.RECIPE_INPUTS)
    assert plan[5]["base"] == (*recipe, "w_fro_level", "w_fro_rate")


def test_a_baseline_whose_geometric_family_has_no_values_is_skipped_not_run_as_the_norm_baseline():
    families = {"weights_vr": ("vr_tp0",), "norms": ("w_fro",)}
    runs = synthetic_runs("topology").assign(w_fro_level=np.nan, w_fro_rate=np.nan)  # e.g. too few surface points
    with pytest.MonkeyPatch.context() as patch:  # w_fro stands in for a declared geometric feature
        patch.setattr(verdict, "kind", lambda f: "geometric" if f == "w_fro" else "topological")
        table, _ = verdict.incremental_validity(runs, analysis_params(permutations=9), families)
    late = table[table.fraction == 0.5]
    geo = late[late.baseline == "norm+norms"]
    assert len(geo) and (geo.status == "skipped").all()
    assert geo.reason.str.startswith("baseline norm+norms has no usable values; not used").all()
    assert (late[(late.baseline == "norm") & (late.family == "weights_vr")].status == "ok").all()


def test_the_comparisons_run_in_a_process_pool_give_the_tables_they_give_here():
    runs = synthetic_runs("topology").query("fraction != 0.3")
    jobs = []

    def counting(fn, js):
        jobs.extend(js)
        return [fn(job) for job in js]

    here = verdict.incremental_validity(runs, PARAMS, FAMILIES, map_jobs=counting)
    pool = functools.partial(compute.map_jobs, workers=2, label="verdict", unit="comparisons")
    pooled = verdict.incremental_validity(runs, PARAMS, FAMILIES, map_jobs=pool)
    assert len(jobs) >= 2 * compute.MIN_JOBS_PER_WORKER  # enough for map_jobs to start its two workers
    for serial, other in zip(here, pooled, strict=True):
        pd.testing.assert_frame_equal(serial, other)
    default = verdict.incremental_validity(runs, PARAMS, FAMILIES)
    pd.testing.assert_frame_equal(here[0], default[0])
