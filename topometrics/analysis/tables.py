"""The paper's analysis over a populated warehouse connection: tests, fits, predictions.

:func:`run_analysis` reads the tables and views of a DuckDB connection (the in-memory database
the analysis stage fills with :func:`topometrics.analysis.warehouse.populate`), and returns the
``predictions``, ``fits`` and ``tests`` tables as DataFrames
(:func:`topometrics.analysis.metrics_file.build_metrics` turns them into ``reports/metrics.json``).
No file is read or written here.

Why over 400 lines: the three tables share one reading of the warehouse's views (the checkpoint rows, each
run's curve and its cut at every fraction); apart, the fits and the tests could read two different cuts.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from topometrics.analysis import decide, partial, predict, stats
from topometrics.dynamics import changepoints
from topometrics.models.lr_schedule import Schedule
from topometrics.params import AnalysisParams, ParamsError
from topometrics.verdict import baselines, decisions, verdict
from topometrics.vocabulary import kind, lookup, run_level, verdict_families

LOSS_ONLY = "loss_power_law"
# A checkpoint's validation loss in analysis.loss_unit (as final_checkpoints.loss): the loss curves the
# predictions extrapolate and the verdict's targets are then in the same unit as the final loss.
CHOSEN_LOSS = "CASE WHEN (SELECT any_value(loss_unit) FROM settings) = 'bpb' THEN val_bpb ELSE val_loss END"


def run_analysis(con, params: AnalysisParams) -> dict[str, pd.DataFrame]:
    """Every statistic the SQL views cannot compute, as the warehouse's analysis tables.

    ``con`` holds the runs of one recipe variant, ``params.variant`` (the analysis stage loads only
    those): fits across rungs compare sizes trained with the same recipe.

    Returns
    -------
    dict
        ``predictions``, ``fits`` and ``tests`` DataFrames with the columns of ``sql/00_schema.sql``.
    """
    check_feature_names(params)
    predictions, curve_fits = prediction_table(con, params)
    tests = [spearman_tests(con, params), topo_vs_spectral_tests(con, params), across_seed_tests(con, predictions)]
    tests.append(_with_bonferroni(partial_tests(con, params), params.alpha))
    tests.append(changepoint_tests(con, params))
    tests = pd.concat([t for t in tests if len(t)], ignore_index=True).reindex(columns=_TEST_COLUMNS)
    fits = pd.concat([scaling_fits(con), curve_fits], ignore_index=True)
    tables = {"predictions": predictions, "fits": fits, "tests": tests}
    return {name: frame.assign(variant=params.variant) for name, frame in tables.items()}


def between_run_tables(con, params: AnalysisParams, map_jobs=None) -> dict[str, pd.DataFrame]:
    """The ``incremental_validity`` and ``incremental_errors`` tables (:mod:`topometrics.verdict.verdict`, and the
    outlier rows of :func:`topometrics.verdict.decisions.outlier_verdict`) over every run in ``con``, all recipe
    variants together (leave-one-variant-out needs them), and the decisions drawn from them
    (:func:`topometrics.analysis.decide.decision_tables`); ``verdict_inputs``, the per run x fraction inputs
    (not a warehouse table: the analysis stage fits the live forecaster on them). ``map_jobs``: where the
    verdict's comparisons run (:func:`topometrics.verdict.verdict.incremental_validity`; None: here)."""
    _, _, inputs = _predictions_and_inputs(con, params, learned=False)
    validity, errors = verdict.incremental_validity(inputs, params, map_jobs=map_jobs)
    if len(inputs):
        validity = pd.concat([validity, decisions.outlier_verdict(inputs, params)], ignore_index=True)
    tables = {"incremental_validity": validity, "incremental_errors": errors, "verdict_inputs": inputs}
    return tables | decide.decision_tables(con, inputs, validity, errors, params)  # intervals, stopping


def partial_tests(con, params: AnalysisParams) -> pd.DataFrame:
    """Partial Spearman rho of every layer-'all' feature with val_loss given w_fro and given the step, per run."""
    frame = con.execute(
        """SELECT f.rung, f.seed, f.step, f.feature, f.layer, f.value, c.val_loss, n.value AS w_fro
           FROM features f JOIN checkpoints c USING (rung, variant, seed, step)
           LEFT JOIN features n ON n.rung = f.rung AND n.variant = f.variant AND n.seed = f.seed
                AND n.step = f.step AND n.layer = 'all' AND n.feature = 'w_fro'
           WHERE f.layer = 'all' ORDER BY ALL"""
    ).df()
    return partial.partial_spearman_tests(frame, params.bootstrap, params.seed).reindex(columns=_TEST_COLUMNS)


def changepoint_tests(con, params: AnalysisParams) -> pd.DataFrame:
    """Per run: the first changepoint step and the count of the validation loss (``analysis.loss_unit``), each
    ``analysis.headline_features`` series (layer 'all') and the learning rate at the checkpoints; and each
    feature's first-changepoint lag (checkpoints) from the loss's and the learning rate's
    (:func:`topometrics.dynamics.changepoints.run_changepoint_rows`, penalty ``analysis.changepoint_penalty``)."""
    names = ", ".join(f"'{f}'" for f in params.headline_features) or "NULL"
    frame = con.execute(
        f"""SELECT rung, variant, seed, step, 'val_loss' AS name, {CHOSEN_LOSS} AS value FROM checkpoints
            UNION ALL SELECT rung, variant, seed, step, feature, value FROM features
            WHERE layer = 'all' AND feature IN ({names})
            UNION ALL SELECT s.rung, s.variant, s.seed, s.step, 'lr', s.lr FROM steps AS s
            JOIN checkpoints AS c USING (rung, variant, seed, step) ORDER BY ALL"""
    ).df()
    rows = []
    for (rung, _variant, seed), run in frame.groupby(["rung", "variant", "seed"], sort=True):
        series = {n: (g["step"].to_numpy(), g["value"].to_numpy(float)) for n, g in run.groupby("name", sort=False)}
        lr = series.pop("lr", "no learning-rate log (an external series)")
        if "val_loss" not in series:
            continue
        found = changepoints.run_changepoint_rows(series, "val_loss", lr, params.changepoint_penalty)
        rows += [{"rung": rung, "seed": seed, "layer": "all"} | r for r in found]
    return pd.DataFrame(rows, columns=_TEST_COLUMNS)


def check_feature_names(params: AnalysisParams) -> None:
    """Raise :class:`ParamsError` naming the key when an ``analysis.*_features`` list has an undeclared name."""
    for key in ("topology_features", "weight_norm_features", "headline_features"):
        unknown = [name for name in getattr(params, key) if lookup(name) is None]
        if unknown:
            raise ParamsError(f"analysis.{key} names undeclared features {unknown}; use names of docs/features.md")


def spearman_tests(con, params: AnalysisParams) -> pd.DataFrame:
    """Spearman rho of every feature x layer with val_loss per run: p-value, bootstrap CI, Bonferroni flag."""
    pairs = con.execute(
        """SELECT f.rung, f.seed, f.feature, f.layer, f.value, c.val_loss
           FROM features f JOIN checkpoints c USING (rung, seed, step) ORDER BY ALL"""
    ).df()
    rows = []
    for (rung, seed, feature, layer), g in pairs.groupby(["rung", "seed", "feature", "layer"], sort=True):
        r = stats.spearman_bootstrap(g["value"], g["val_loss"], params.bootstrap, params.seed)
        rows.append(
            {"kind": "spearman", "rung": rung, "seed": seed, "feature": feature, "layer": layer}
            | {"estimate": r.rho, "ci_low": r.ci_low, "ci_high": r.ci_high, "p_value": r.p_value, "n": r.n}
            | {"reason": r.reason}
        )
    return _with_bonferroni(pd.DataFrame(rows, columns=_TEST_COLUMNS), params.alpha)


def topo_vs_spectral_tests(con, params: AnalysisParams) -> pd.DataFrame:
    """Steiger's Fisher-z test of |rho(topological, loss)| vs |rho(spectral, loss)|, layer 'all', per run.

    Both correlations are oriented to be positive first (a feature's sign is arbitrary), so the
    test compares strength; a positive statistic means the topological feature tracks the loss better.
    """
    wide = con.execute(
        """SELECT f.rung, f.seed, f.step, f.feature, f.value, c.val_loss FROM features f
           JOIN checkpoints c USING (rung, seed, step) WHERE f.layer = 'all' ORDER BY ALL"""
    ).df()
    rows = []
    for (rung, seed), g in wide.groupby(["rung", "seed"], sort=True):
        table = g.pivot_table(index="step", columns="feature", values="value", dropna=False)
        loss = g.drop_duplicates("step").set_index("step")["val_loss"].reindex(table.index)
        topo = [f for f in table.columns if kind(f) == "topological"]
        spectral = [f for f in table.columns if kind(f) == "spectral"]
        for x in topo:
            for z in spectral:
                rows.append(_steiger_row(rung=rung, seed=seed, topological=table[x], spectral=table[z], loss=loss))
    return _with_bonferroni(pd.DataFrame(rows, columns=_TEST_COLUMNS), params.alpha)


def across_seed_tests(con, predictions: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """With several seeds: mean and t-CI over seeds of every rho (per rung, in Fisher-z space) and of every MAE."""
    rho = con.execute("SELECT * FROM feature_loss_spearman").df()
    if rho["seed"].nunique() < 2:
        return pd.DataFrame(columns=_TEST_COLUMNS)
    rows = []
    for (rung, feature, layer), g in rho.groupby(["rung", "feature", "layer"], sort=True):
        mean, lo, hi = stats.correlation_mean_ci(g["rho"], level)
        interval = (mean, lo, hi)
        rows.append(_summary_row("spearman_across_seeds", interval, len(g), rung=rung, feature=feature, layer=layer))
    ok = predictions[predictions["status"] == "ok"].assign(err=lambda d: (d["predicted"] - d["actual"]).abs())
    per_seed = ok.groupby(["method", "cv", "fraction", "seed"])["err"].mean().reset_index()
    for (method, cv, fraction), g in per_seed.groupby(["method", "cv", "fraction"], sort=True):
        mean, lo, hi = stats.mean_ci(g["err"], level)
        rows.append(_summary_row("mae_across_seeds", (mean, lo, hi), len(g), other=f"{method}/{cv}/{fraction:g}"))
    return pd.DataFrame(rows, columns=_TEST_COLUMNS)


def scaling_fits(con) -> pd.DataFrame:
    """Power laws f(N) = a N^b + c of final layer-'all' features and final val loss over the ladder (Tables 1, 7).

    Seeds are averaged per rung first: the fit is across model sizes.
    """
    final = con.execute(
        f"""SELECT feature, layer, n_params, avg(value) AS value FROM scaling
           WHERE kind = 'ladder' AND layer IN ('all', 'checkpoint') AND (rung, seed) NOT IN ({DIVERGED})
           GROUP BY feature, layer, n_params ORDER BY ALL"""
    ).df()
    excluded = diverged_runs(con)
    note = (
        None
        if excluded.empty
        else "excluded diverged runs: "
        + "; ".join(f"{r.rung}-{r.seed} ({r.status_reason})" for r in excluded.itertuples(index=False))
    )
    rows = []
    for (feature, layer), g in final.groupby(["feature", "layer"], sort=True):
        fit = stats.fit_power_law(g["n_params"].to_numpy(float), g["value"].to_numpy(float))
        rows.append(_fit_row("scaling", feature, fit, layer=layer) | {"reason": fit.reason or note})
    return pd.DataFrame(rows, columns=_FIT_COLUMNS)


def prediction_table(con, params: AnalysisParams) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Final-loss predictions of every method at every fraction (Table 5) and the loss-curve fits behind them."""
    predictions, fits, _ = _predictions_and_inputs(con, params)
    return predictions, fits


def _predictions_and_inputs(con, params: AnalysisParams, learned: bool = True):
    """:func:`prediction_table` and the per run x fraction inputs of the learned and nested models."""
    runs = con.execute(
        """SELECT r.rung, r.variant, r.seed, coalesce(r.steps, f.step) AS steps, coalesce(r.warmup, 0) AS warmup,
                  coalesce(r.lr, 1.0) AS lr, coalesce(r.min_lr_ratio, 0.0) AS min_lr_ratio, f.loss AS actual,
                  r.status, r.status_reason, r.config_json
           FROM runs r JOIN final_checkpoints f USING (rung, variant, seed) WHERE r.kind = 'ladder'
           ORDER BY rung, variant, seed"""
    ).df()
    series = _run_series(con, params)
    predictions, fits, inputs = [], [], []
    for run in runs.itertuples(index=False):
        if run.status == "diverged":  # data, not a training curve to extrapolate: recorded, not fitted
            rows, fit_rows = _excluded_rows(run, params)
            predictions += rows
            fits += fit_rows
            continue
        schedule = run_schedule(run._asdict())
        for fraction in params.fractions:
            rows, fit_rows, features = _curve_predictions(run, schedule, fraction, series, params)
            predictions += rows
            fits += fit_rows
            inputs.append(features)
    inputs = pd.DataFrame(inputs, columns=None if inputs else ["rung", "variant", "seed", "fraction", "n_seen"])
    if len(inputs):  # the same-fraction loss ranked across runs: 1 = the lowest last observed loss, ties averaged
        inputs["loss_rank"] = inputs.groupby("fraction")["anchor"].rank(method="average")
    rows = _learned_predictions(inputs, params) if learned and len(inputs) else []
    columns = ["method", "cv", "fraction", "rung", "seed", "predicted", "actual", "status", "reason", "trained_on"]
    return pd.DataFrame(predictions + rows, columns=columns), pd.DataFrame(fits, columns=_FIT_COLUMNS), inputs


def run_schedule(run: dict) -> Schedule:
    """The LR schedule a run trained with: its ``runs`` recipe columns, and the shape (``schedule``,
    ``decay_fraction``) from its config's recipe, which the config file holds only when it is not the cosine."""
    recipe = json.loads(run.get("config_json") or "{}").get("recipe", {})
    return Schedule.from_recipe(run | {k: recipe.get(k) for k in ("schedule", "decay_fraction")})


# --- helpers -------------------------------------------------------------------------------------

_TEST_COLUMNS = [
    "kind", "rung", "seed", "feature", "layer", "other", "estimate", "ci_low", "ci_high",
    "statistic", "p_value", "n", "p_bonferroni", "significant", "reason",
]  # fmt: skip
_FIT_COLUMNS = [
    "kind", "target", "layer", "rung", "seed", "fraction", "a", "b", "c",
    "params_json", "r2", "spearman_rho", "spearman_p", "n", "status", "reason",
]  # fmt: skip


def _with_bonferroni(frame: pd.DataFrame, alpha: float) -> pd.DataFrame:
    if frame.empty:
        return frame
    adjusted, significant = stats.bonferroni(frame["p_value"].to_numpy(float), alpha)
    return frame.assign(p_bonferroni=adjusted, significant=significant)


def _steiger_row(*, rung, seed, topological: pd.Series, spectral: pd.Series, loss: pd.Series) -> dict:
    """Steiger's test row of one run: the two feature series (named by their feature) and the loss, by step."""
    both = pd.concat([topological, spectral, loss], axis=1).dropna().to_numpy(float)
    row = {"kind": "topo_vs_spectral", "rung": rung, "seed": seed, "feature": topological.name, "layer": "all"}
    row["other"] = spectral.name
    n = len(both)
    if n <= 3 or np.ptp(both, axis=0).min() == 0:
        return row | {"n": n, "reason": "fewer than 4 checkpoints or a constant series"}
    r_xy, r_zy, r_xz = (spearmanr(both[:, i], both[:, j]).statistic for i, j in ((0, 2), (1, 2), (0, 1)))
    # orient both features to correlate positively with the loss, so the test compares |rho|
    r_xz *= np.sign(r_xy) * np.sign(r_zy)
    z_stat, p = stats.steiger_z(abs(r_xy), abs(r_zy), r_xz, n)
    return row | {"estimate": abs(r_xy) - abs(r_zy), "statistic": z_stat, "p_value": p, "n": n}


def _summary_row(
    kind, interval: tuple[float, float, float], n: int, *, rung=None, feature=None, layer=None, other=None
):
    """A ``tests`` row of an across-seed summary: ``interval`` = (mean, ci_low, ci_high) over ``n`` seeds."""
    mean, lo, hi = interval
    reason = None if np.isfinite(lo) else f"{n} seed(s): no CI"
    return {"kind": kind, "rung": rung, "feature": feature, "layer": layer, "other": other}| {
        "estimate": mean, "ci_low": lo, "ci_high": hi, "n": n, "reason": reason,
    }  # fmt: skip


def _fit_row(kind, target, fit: stats.Fit, *, layer=None, rung=None, seed=None, fraction=None) -> dict:
    p = fit.params
    return {
        "kind": kind, "target": target, "layer": layer, "rung": rung, "seed": seed, "fraction": fraction,
        "a": p.get("a"), "b": p.get("b"), "c": p.get("c"), "params_json": json.dumps(p, sort_keys=True),
        "r2": fit.r2, "spearman_rho": fit.spearman_rho, "spearman_p": fit.spearman_p, "n": fit.n,
        "status": fit.status, "reason": fit.reason,
    }  # fmt: skip


def _run_series(con, params: AnalysisParams) -> dict[tuple, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Per (rung, variant, seed): name -> (steps, values) of val_loss, np, grad_norm, weight_norm, topology features."""
    families = (f for fam in verdict_families().values() for f in fam if not run_level(f))
    wanted = dict.fromkeys([*params.topology_features, *families, *changepoint_series(params)])
    names = ", ".join(f"'{f}'" for f in wanted)
    frames = {
        "val_loss": f"SELECT rung, variant, seed, step, {CHOSEN_LOSS} AS value FROM checkpoints",
        "np": "SELECT rung, variant, seed, step, np AS value FROM np_series",
        "grad_norm": "SELECT rung, variant, seed, step, grad_norm AS value FROM steps",
        # weight norm of the whole network: the layer-'all' row, else the 2-norm over layers
        "weight_norm": f"""SELECT rung, variant, seed, step, coalesce(max(value) FILTER (WHERE layer = 'all'),
                               sqrt(sum(value * value) FILTER (WHERE layer <> 'all'))) AS value
                        FROM features WHERE feature = '{_present(con, params.weight_norm_features)}'
                        GROUP BY rung, variant, seed, step""",
        "topology": f"""SELECT rung, variant, seed, step, feature, value FROM features
                        WHERE layer = 'all' AND feature IN ({names or "NULL"})""",
    }
    out: dict[tuple, dict] = {}
    for name, sql in frames.items():
        df = con.execute(sql + " ORDER BY ALL").df()
        key_cols = ["rung", "variant", "seed", "feature"] if name == "topology" else ["rung", "variant", "seed"]
        for key, g in df.groupby(key_cols, sort=True):
            series_name = key[3] if name == "topology" else name
            out.setdefault(key[:3], {})[series_name] = (g["step"].to_numpy(float), g["value"].to_numpy(float))
    return out


# Runs that are data but not training curves: kept in every table, left out of fits and predictions.
DIVERGED = "SELECT rung, seed FROM runs WHERE status = 'diverged'"


def diverged_runs(con) -> pd.DataFrame:
    """(rung, seed, status_reason) of every diverged run."""
    return con.execute("SELECT rung, seed, status_reason FROM runs WHERE status = 'diverged' ORDER BY ALL").df()


def _excluded_rows(run, params: AnalysisParams) -> tuple[list[dict], list[dict]]:
    """Prediction and fit rows that record why a diverged run was left out (status 'excluded')."""
    reason = f"run diverged: {run.status_reason}"
    base = {"rung": run.rung, "seed": run.seed, "actual": run.actual, "predicted": None}
    base |= {"status": "excluded", "reason": reason, "trained_on": None}
    predictions, fits = [], []
    for fraction in params.fractions:
        for method in (LOSS_ONLY, "schedule_aware", "lr_annealing"):
            predictions.append(base | {"method": method, "cv": "none", "fraction": fraction})
            fit = {"kind": "loss_curve", "target": method, "rung": run.rung, "seed": run.seed, "fraction": fraction}
            fits.append(fit | {"status": "excluded", "reason": reason})
        for method in _learned_methods(params):
            predictions.append(base | {"method": method, "cv": "rung", "fraction": fraction})
    return predictions, fits


def _curve_predictions(run, schedule: Schedule, fraction: float, series: dict, params: AnalysisParams | None = None):
    """Loss-curve predictions for one run and fraction, their fit rows, and the learned models' inputs (with
    ``params``, also the changepoint family's, from the series :func:`changepoint_series` names)."""
    run_values = series.get((run.rung, run.variant, run.seed), {})
    cutoff = fraction * schedule.steps
    t, loss = run_values.get("val_loss", (np.array([]), np.array([])))
    seen = predict.observed(t, cutoff)
    base = {"fraction": fraction, "rung": run.rung, "seed": run.seed, "actual": run.actual}
    pl_fit, pl_pred = predict.fit_loss_power_law(t[seen], loss[seen], schedule.steps, schedule.warmup)
    mpl_fit, mpl_pred = predict.fit_multi_power_law(t[seen], loss[seen], schedule)
    lra_fit, lra_pred = predict.fit_lr_annealing(t[seen], loss[seen], schedule)
    laws = ((LOSS_ONLY, pl_fit, pl_pred), ("schedule_aware", mpl_fit, mpl_pred), ("lr_annealing", lra_fit, lra_pred))
    rows, fits = [], []
    for method, fit, value in laws:
        rows.append(
            base | {"method": method, "cv": "none", "predicted": value, "status": fit.status, "reason": fit.reason}
        )
        fits.append(_fit_row("loss_curve", method, fit, rung=run.rung, seed=run.seed, fraction=fraction))
    anchor = float(loss[seen][np.argmax(t[seen])]) if seen.any() else np.nan
    features = base | {"variant": run.variant, "anchor": anchor, "n_seen": int(seen.sum())}
    features |= baselines.recipe_inputs(_run_config(run))  # the recipe part of the verdict's baselines
    for name, value in zip(baselines.LOSS, (pl_pred, mpl_pred, lra_pred), strict=True):  # the laws, in order
        features[name] = (value if value is not None else np.nan) - anchor
    window = predict.gradnorm_window(*run_values.get("grad_norm", ([], [])), cutoff)
    features |= dict(zip(baselines.GRAD, window, strict=True))
    for name, (steps, values) in run_values.items():
        if name != "val_loss":
            features[f"{name}_level"], features[f"{name}_rate"] = predict.window_summary(steps, values, cutoff)
            if _trailing_window(name):  # its value at the last checkpoint is the window ending there
                features[f"{name}_level"] = predict.value_at(steps, values, cutoff)
    if params is not None:
        watched = [run_values[f] for f in changepoint_series(params) if f in run_values]
        found = changepoints.window_changepoints(watched, cutoff, schedule.steps, params.changepoint_penalty)
        features["cp_count"], features["cp_first"] = found
    return rows, fits, features


def _run_config(run) -> dict:
    """A run's config (``runs.config_json``: recipe, shape, n_params), with the recipe's schedule filled in."""
    config = json.loads(getattr(run, "config_json", None) or "{}")
    recipe = config.get("recipe", {})
    return config | {"recipe": recipe | {k: v for k, v in _recipe_columns(run).items() if recipe.get(k) is None}}


def _recipe_columns(run) -> dict:
    return {k: getattr(run, k, None) for k in ("steps", "warmup", "lr")}


def changepoint_series(params: AnalysisParams) -> tuple[str, ...]:
    """The series whose changepoints the verdict's ``changepoints`` family reads: the topological
    ``analysis.headline_features``."""
    return tuple(f for f in params.headline_features if kind(f) == "topological")


def _trailing_window(name: str) -> bool:
    """Whether a feature is already a summary of the run's trailing window (the ``trajectory`` family)."""
    feature = lookup(name)
    return feature is not None and feature.family.name == "trajectory"


def _learned_methods(params: AnalysisParams) -> dict[str, tuple[str, ...]]:
    """Feature columns of every learned method; each predicts the drop from the last observed val loss."""
    topo = tuple(f"{s}_{k}" for s in ("np", *params.topology_features) for k in ("level", "rate"))
    grad, weight = ("grad_norm_level", "grad_norm_rate"), baselines.NORM
    return {
        "loss_learned": ("loss_drop",),
        "topology": topo,
        "loss_topology": ("loss_drop", *topo),
        "gradnorm": grad,
        "loss_gradnorm": ("loss_drop", *grad),
        "weightnorm": weight,
        "loss_weightnorm": ("loss_drop", *weight),
    }


def _learned_predictions(inputs: pd.DataFrame, params: AnalysisParams) -> list[dict]:
    """Leave-one-rung-out (and, with several seeds, leave-one-seed-out) predictions of every learned method."""
    schemes = ["rung"] + (["seed"] if inputs["seed"].nunique() > 1 else [])
    rows = []
    for method, columns in _learned_methods(params).items():
        absent = [c for c in columns if c not in inputs]
        for fraction, g in inputs.groupby("fraction", sort=True):
            g = g.reset_index(drop=True)
            x = g.reindex(columns=list(columns)).to_numpy(float)
            target = g["actual"].to_numpy(float) - g["anchor"].to_numpy(float)
            for scheme in schemes:
                pred, trained, reasons = predict.cross_validate(x, target, g[scheme].to_numpy())
                labels = (g["rung"] + ":" + g["seed"].astype(str)).to_numpy()
                for i, r in g.iterrows():
                    ok = np.isfinite(pred[i])
                    reason = reasons[i] if not absent else f"no {', '.join(absent)} in the inputs"
                    rows.append(
                        {"method": method, "cv": scheme, "fraction": fraction, "rung": r["rung"], "seed": r["seed"]}
                        | {"actual": r["actual"], "predicted": r["anchor"] + pred[i] if ok else None}
                        | {"status": "ok" if ok else "failed", "reason": None if ok else reason}
                        | {"trained_on": ",".join(sorted(labels[trained[i]])) if ok else None}
                    )
    return rows


def _present(con, names: tuple[str, ...]) -> str:
    """The first of ``names`` that occurs as a feature (the first name when none does)."""
    found = {r[0] for r in con.execute("SELECT DISTINCT feature FROM features").fetchall()}
    return next((n for n in names if n in found), names[0] if names else "")
