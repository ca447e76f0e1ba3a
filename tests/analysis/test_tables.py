"""topometrics.analysis.tables and the analysis -> warehouse stages, end to end on a synthetic ladder."""

import json
import re
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest
import scipy.stats

from tests.analysis.helpers import RUNGS, write_inputs
from tests.repo_params import analysis_params
from topometrics.analysis import metrics_file, tables, warehouse
from topometrics.params import ParamsError
from topometrics.vocabulary import kind

REPO = Path(__file__).resolve().parents[2]
LEARNED = ("loss_learned", "topology", "loss_topology", "gradnorm", "loss_gradnorm", "weightnorm", "loss_weightnorm")


def test_every_method_predicts_every_rung_at_every_fraction(con):
    p = con.execute("SELECT * FROM predictions").df()
    methods = {"loss_power_law", "schedule_aware", "lr_annealing", *LEARNED}
    assert set(p["method"]) == methods
    assert len(p) == len(methods) * 3 * len(RUNGS)  # one seed: leave-one-rung-out only
    assert (p["status"] == "ok").all(), p.loc[p["status"] != "ok", "reason"].tolist()
    assert np.isfinite(p["predicted"]).all()
    final = dict(con.execute("SELECT rung, val_loss FROM final_checkpoints").fetchall())
    assert (p["actual"] == p["rung"].map(final)).all()


def test_learned_models_never_train_on_the_held_out_rung(con):
    p = con.execute("SELECT rung, trained_on FROM predictions WHERE cv = 'rung'").df()
    assert len(p) == len(LEARNED) * 3 * len(RUNGS)
    for rung, trained in p.itertuples(index=False):
        rungs = {label.split(":")[0] for label in trained.split(",")}
        assert rung not in rungs and len(rungs) == len(RUNGS) - 1


def test_loss_curve_fits_are_recorded_with_their_parameters(con):
    fits = con.execute("SELECT * FROM fits WHERE kind = 'loss_curve'").df()
    assert len(fits) == 3 * 3 * len(RUNGS)
    mpl = json.loads(fits.loc[fits["target"] == "schedule_aware", "params_json"].iloc[0])
    assert set(mpl) == {"L0", "A", "alpha", "B", "C", "beta", "gamma"}
    lra = json.loads(fits.loc[fits["target"] == "lr_annealing", "params_json"].iloc[0])
    assert set(lra) == {"L0", "A", "alpha", "C", "lambda"}


def test_spearman_tests_agree_with_the_view_and_carry_bonferroni(con):
    t = con.execute("SELECT * FROM tests WHERE kind = 'spearman'").df()
    view = con.execute("SELECT * FROM feature_loss_spearman").df()
    merged = t.merge(view, on=["rung", "seed", "feature", "layer"])
    assert len(merged) == len(view) == len(t)
    both = merged["rho"].notna()
    assert np.allclose(merged.loc[both, "estimate"], merged.loc[both, "rho"], atol=1e-9)
    m = t["p_value"].notna().sum()
    assert np.allclose(t["p_bonferroni"].dropna(), np.minimum(1, t["p_value"].dropna() * m))
    tp0 = t[(t["feature"] == "vr_tp0") & (t["layer"] == "all")]
    assert (tp0["ci_high"] < 0).all() and tp0["significant"].all()


def test_topological_and_spectral_correlations_are_compared(con):
    t = con.execute("SELECT * FROM tests WHERE kind = 'topo_vs_spectral'").df()
    assert set(t["feature"].map(kind)) == {"topological"}
    assert set(t["other"].map(kind)) == {"spectral"}
    assert len(t) == len(RUNGS) * 4 * 2  # (np_norm, np_norm_std, vr_tp0, vr_tp1) x (w_fro, w_spec)


def test_scaling_fit_recovers_the_loss_exponent(con):
    row = con.execute("SELECT * FROM fits WHERE kind = 'scaling' AND target = 'val_loss'").df().iloc[0]
    assert row.status == "ok" and row.b == pytest.approx(-0.144, abs=0.05)  # the synthetic floor's exponent
    assert row.spearman_rho == pytest.approx(-1.0)


def test_docs_example_queries_run(con):
    text = (REPO / "docs" / "warehouse.md").read_text()
    queries = re.findall(r"```sql\n(.*?)```", text, flags=re.S)
    assert len(queries) >= 5
    for query in queries:
        assert con.execute(query).fetchall(), query


def test_readme_example_queries_run(con):
    (block,) = re.findall(r"```sql\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)
    queries = [q for q in block.split(";\n") if q.strip()]
    assert len(queries) == 5
    for query in queries:
        assert con.execute(query).fetchall(), query


def test_several_seeds_get_leave_one_seed_out_and_across_seed_cis(tmp_path):
    inputs = write_inputs(tmp_path, rungs={k: RUNGS[k] for k in ("tiny", "medium", "xl")}, seeds=(1, 2))
    params = analysis_params(fractions=(0.5,), bootstrap=50)
    c = duckdb.connect()
    warehouse.populate(c, inputs, params.settings(), {})
    results = tables.run_analysis(c, params)
    p = results["predictions"]
    by_seed = p[p["cv"] == "seed"]
    assert len(by_seed) == len(LEARNED) * 6 and (by_seed["status"] == "ok").all()
    for seed, trained in by_seed[["seed", "trained_on"]].itertuples(index=False):
        assert str(seed) not in {label.split(":")[1] for label in trained.split(",")}
    kinds = results["tests"].groupby("kind").size()
    assert kinds["spearman_across_seeds"] > 0 and kinds["mae_across_seeds"] == len(LEARNED) * 2 + 3
    across = results["tests"].query("kind == 'spearman_across_seeds' and feature == 'vr_tp0' and layer == 'all'")
    assert (across["n"] == 2).all() and (across["ci_low"] <= across["estimate"]).all()

    # the tests table carries the across-seed intervals: Student-t CI of the per-seed rho in Fisher-z space (scipy)
    rhos = c.execute(
        "SELECT rho FROM feature_loss_spearman WHERE rung = 'medium' AND feature = 'vr_tp0' AND layer = 'all'"
    ).df()["rho"]
    z = np.arctanh(rhos)  # Fisher z: the interval is taken there and mapped back with tanh
    low, high = scipy.stats.t.interval(0.95, len(z) - 1, loc=z.mean(), scale=scipy.stats.sem(z))
    got = across[across["rung"] == "medium"].iloc[0]
    assert np.allclose([got["estimate"], got["ci_low"], got["ci_high"]], np.tanh([z.mean(), low, high]), rtol=1e-9)
    mae = results["tests"].query("kind == 'mae_across_seeds'").set_index("other")
    assert {"loss_power_law/none/0.5", "topology/rung/0.5", "topology/seed/0.5"} <= set(mae.index)
    assert mae.loc["loss_power_law/none/0.5", "n"] == 2
    # metrics.json: the rung's final loss is the mean over its seeds
    for name, frame in results.items():
        frame.to_parquet(tmp_path / f"{name}.parquet", index=False)
        warehouse.load_parquet(c, name, [tmp_path / f"{name}.parquet"])
    metrics = metrics_file.build_metrics(c, params)
    final = c.execute("SELECT avg(val_loss) FROM final_checkpoints WHERE rung = 'medium'").fetchone()[0]
    assert metrics["final_val_loss"]["medium"] == pytest.approx(final, rel=1e-5) and metrics["runs"] == 6


def test_a_run_without_features_fails_the_learned_topology_models_with_a_reason(tmp_path):
    inputs = write_inputs(tmp_path, rungs={k: RUNGS[k] for k in ("tiny", "small", "medium", "large")})
    inputs = warehouse.Inputs(**(inputs.__dict__ | {"feature_files": inputs.feature_files[1:]}))  # 'large' has none
    params = analysis_params(fractions=(0.5,), bootstrap=20)
    c = duckdb.connect()
    warehouse.populate(c, inputs, params.settings(), {})
    p = tables.run_analysis(c, params)["predictions"].set_index(["method", "rung"])
    assert p.loc[("topology", "large"), "status"] == "failed"
    assert p.loc[("topology", "large"), "reason"] == "missing feature values in the observed window"
    assert p.loc[("loss_power_law", "large"), "status"] == "ok"
    assert pd.isna(p.loc[("topology", "large"), "predicted"])


def test_feature_lists_must_name_declared_features():
    with pytest.raises(ParamsError, match=r"analysis.headline_features names undeclared features \['np_norm_mean'\]"):
        tables.run_analysis(duckdb.connect(), analysis_params(headline_features=("vr_tp0", "np_norm_mean")))


def test_a_diverged_run_is_data_left_out_of_fits_and_predictions_with_its_reason(tmp_path):
    data = tmp_path / "data"
    write_inputs(data)
    reason = "loss is nan at step 1234; kept checkpoints up to step 1200"
    (data / "runs" / "large-42" / "run.json").write_text(json.dumps({"status": "diverged", "reason": reason}))
    (data / "runs" / "tiny-42" / "run.json").write_text(json.dumps({"status": "complete", "reason": ""}))
    source = data / "corpus" / "source.json"
    inputs = warehouse.discover_inputs(warehouse.Sources(data / "config", data / "runs", source, [data / "features"]))
    con = duckdb.connect()
    warehouse.populate(con, inputs, analysis_params().settings(), {})
    runs = con.execute("SELECT rung, status, status_reason FROM runs ORDER BY rung").fetchall()
    assert ("large", "diverged", reason) in runs and ("tiny", "complete", None) in runs and ("xl", None, None) in runs
    params = analysis_params(bootstrap=20)
    results = tables.run_analysis(con, params)
    mine = results["predictions"].query("rung == 'large'")
    assert len(mine) == 3 * (3 + len(LEARNED)) and (mine["status"] == "excluded").all()
    assert (mine["reason"] == f"run diverged: {reason}").all() and mine["predicted"].isna().all()
    others = results["predictions"].query("rung != 'large'")
    assert not others["trained_on"].fillna("").str.contains("large").any()
    curve_fits = results["fits"].query("kind == 'loss_curve' and rung == 'large'")
    assert len(curve_fits) == 9 and (curve_fits["status"] == "excluded").all()
    scaling = results["fits"].query("kind == 'scaling' and target == 'val_loss'")
    assert scaling["n"].tolist() == [len(RUNGS) - 1]
    assert scaling["reason"].tolist() == [f"excluded diverged runs: large-42 ({reason})"]
    for name, frame in results.items():
        con.register(f"_{name}", frame)
        con.execute(f"INSERT INTO {name} BY NAME SELECT * FROM _{name}")
    metrics = metrics_file.build_metrics(con, params)
    assert "large" not in metrics["final_val_loss"] and metrics["diverged_runs"] == 1


def test_partial_spearman_rows_and_view(con):
    view = con.execute("SELECT * FROM partial_spearman WHERE rung = 'xl' AND layer = 'all'").df()
    assert set(view["control"]) == {"w_fro", "step"}
    assert not ((view["control"] == "w_fro") & (view["feature"] == "w_fro")).any()
    # w_fro's 'all' row is the norm of the layers' w_fro: vr_tp0 still tracks the loss beyond it (it is built from it)
    row = view[(view["feature"] == "vr_tp0") & (view["control"] == "w_fro")].iloc[0]
    assert row["raw_rho"] < -0.9 and np.isfinite(row["partial_rho"]) and row["ci_low"] <= row["partial_rho"]
    assert (view["partial_rho"].notna() | view["reason"].notna()).all()


def test_verdict_on_one_seed_names_every_skip(con):
    verdict = con.execute("SELECT * FROM topology_verdict").df()
    assert set(verdict["cv"]) == {"seed", "variant", "rung"}
    between = verdict[verdict["level"] == "between"]
    seed = between[between["cv"] == "seed"]["verdict"]
    assert (seed == "skipped: leave-one-seed-out needs at least 3 seeds, got 1").all()
    variant = between[between["cv"] == "variant"]["verdict"]
    assert (variant == "skipped: leave-one-variant-out needs at least 3 variants, got 1").all()
    within = verdict[verdict["level"] == "within"]["verdict"]  # one seed per cell: no seeds to shuffle
    assert len(within) and (within == "skipped: the within-cell test needs 2 cells with >= 2 seeds, got 0").all()
    rung = verdict[(verdict["cv"] == "rung") & (verdict["baseline"] == "norm")].set_index(["fraction", "family"])
    assert rung.loc[(0.5, "weights_vr"), "n"] == len(RUNGS)  # vr_tp0, vr_tp1 are in the synthetic features
    assert rung.loc[(0.5, "scale_free"), "verdict"].startswith("skipped: family scale_free has no usable values")
    assert verdict["verdict"].notna().all()


def test_the_changepoint_inputs_are_the_window_changepoints_of_the_features_tables_series(con):
    from topometrics.dynamics.changepoints import window_changepoints

    params = analysis_params()
    _, _, inputs = tables._predictions_and_inputs(con, params, learned=False)
    watched = [f for f in params.headline_features if f in ("vr_tp0", "vr_tp1", "np_norm", "rep_tp0")]
    assert watched == ["vr_tp0", "vr_tp1", "np_norm", "rep_tp0"]  # the topological headline features
    for row in inputs.itertuples():
        frame = con.execute(
            "SELECT feature, step, value FROM features WHERE rung = ? AND seed = ? AND layer = 'all' ORDER BY step",
            [row.rung, row.seed],
        ).df()
        series = [(g["step"].to_numpy(), g["value"].to_numpy()) for f, g in frame.groupby("feature") if f in watched]
        steps = con.execute("SELECT steps FROM runs WHERE rung = ? AND seed = ?", [row.rung, row.seed]).fetchone()[0]
        expected = window_changepoints(series, row.fraction * steps, steps, params.changepoint_penalty)
        np.testing.assert_array_equal([row.cp_count, row.cp_first], expected)
    assert inputs["cp_count"].notna().any()  # the pipeline's runs are long enough to segment at some fraction
    families = set(con.execute("SELECT family FROM topology_verdict").df()["family"])
    assert "changepoints" in families


def test_the_loss_curve_laws_read_each_runs_schedule_shape_from_its_config():
    from tests.helpers import default_raw
    from topometrics.params import parse_params
    from topometrics.training.train import build_run_config

    params = parse_params(default_raw() | {"variants": {"wsd": {"schedule": "wsd", "decay_fraction": 0.25}}})
    for variant, shape in (("base", "cosine"), ("wsd", "wsd")):
        cfg = build_run_config(params, "tiny", 42, variant)
        recipe = cfg.to_dict()["recipe"]
        # the runs row as warehouse.load_run writes it: recipe columns and the config as JSON
        row = {k: recipe[k] for k in ("steps", "warmup", "lr", "min_lr_ratio")}
        row["config_json"] = json.dumps(cfg.to_dict(), sort_keys=True)
        assert tables.run_schedule(row) == cfg.recipe.lr_schedule and tables.run_schedule(row).shape == shape
    assert tables.run_schedule(row | {"config_json": None}).shape == "cosine"  # an external series: no config


def test_gradient_norm_window_columns_equal_numpy_and_the_documented_query(pipeline, con):
    params = analysis_params()
    _, _, inputs = tables._predictions_and_inputs(con, params, learned=False)
    runs_dir = pipeline[0].parent / "runs"
    for row in inputs.itertuples():
        log = pd.read_csv(runs_dir / f"{row.rung}-{row.seed}" / "steps.csv")
        g = log.loc[(log.step >= 1) & (log.step <= row.fraction * 2000) & (log.grad_norm > 0), "grad_norm"].to_numpy()
        assert row.gn_mean == pytest.approx(np.mean(g), rel=1e-12)
        assert row.gn_spread == pytest.approx(np.std(np.log(g), ddof=1), rel=1e-10)
    text = (REPO / "docs" / "warehouse.md").read_text()
    query = next(q for q in re.findall(r"```sql\n(.*?)```", text, flags=re.S) if "gn_spread" in q)
    documented = con.execute(query).df().set_index(["rung", "seed"])
    at_30 = inputs[inputs.fraction == 0.3].set_index(["rung", "seed"])
    assert len(documented) == len(at_30) == len(RUNGS)
    np.testing.assert_allclose(documented.loc[at_30.index, "gn_mean"], at_30["gn_mean"], rtol=1e-12)
    np.testing.assert_allclose(documented.loc[at_30.index, "gn_spread"], at_30["gn_spread"], rtol=1e-10)


def test_loss_rank_ranks_the_last_observed_loss_across_runs_per_fraction(con):
    _, _, inputs = tables._predictions_and_inputs(con, analysis_params(), learned=False)
    for _, g in inputs.groupby("fraction"):
        np.testing.assert_array_equal(g["loss_rank"], scipy.stats.rankdata(g["anchor"], method="average"))
        assert g.loc[g["anchor"].idxmin(), "loss_rank"] == 1


def test_changepoints_view_has_every_run_series_and_the_loss_breaks_of_the_pelt_function(con):
    from topometrics.dynamics.changepoints import series_changepoints

    view = con.execute("SELECT * FROM changepoints ORDER BY ALL").df()
    runs = con.execute("SELECT DISTINCT rung, seed FROM checkpoints").df()
    headline = analysis_params().headline_features
    present = set(con.execute("SELECT DISTINCT feature FROM features WHERE layer = 'all'").df()["feature"])
    for rung, seed in runs.itertuples(index=False):
        rows = view[(view["rung"] == rung) & (view["seed"] == seed)].set_index("series")
        assert set(rows.index) == {"val_loss", "lr", *(f for f in headline if f in present)}, rung
        loss = con.execute(
            "SELECT step, val_loss FROM checkpoints WHERE rung = ? AND seed = ? ORDER BY step", [rung, seed]
        ).df()
        expected = series_changepoints(loss["step"].to_numpy(), loss["val_loss"].to_numpy())
        got = rows.loc["val_loss"]
        assert (got["first_step"] == expected.first_step) or (
            np.isnan(expected.first_step) and pd.isna(got["first_step"])
        )
        assert pd.isna(got["lag_vs_val_loss"]) and pd.isna(got["lag_vs_lr"])  # the reference has no lag
        for feature in set(rows.index) - {"val_loss", "lr"}:  # a NULL lag says why
            assert pd.notna(rows.loc[feature, "lag_vs_val_loss"]) or rows.loc[feature, "lag_vs_val_loss_reason"]


def test_every_baseline_part_has_its_columns_in_the_verdicts_input_table(con):
    # a declared part whose columns nothing computes would only be "not used" in each verdict row's reason
    from topometrics.verdict.baselines import PARTS

    _, _, inputs = tables._predictions_and_inputs(con, analysis_params(), learned=False)
    missing = [c for part in PARTS for c in part.columns if c not in inputs]
    assert missing == [], f"baseline columns topometrics/analysis/tables.py does not compute: {missing}"
