"""The analysis stage's outputs: its tables as Parquet for the warehouse stage, and metrics.json, the small
nested summary of them that ``dvc metrics diff`` compares."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import duckdb
import pandas as pd

from topometrics.analysis import tables as analysis
from topometrics.analysis import verdict, warehouse
from topometrics.analysis.tables import DIVERGED, LOSS_ONLY, diverged_runs
from topometrics.atomic import write_parquet, write_text
from topometrics.execution.shards import params_digest
from topometrics.params import AnalysisParams, Params


def write_analysis(params: Params, configs, runs, corpus, features, out: Path, metrics: Path, log=print) -> str:
    """The analysis stage: the runs of ``analysis.variant`` (the between-run verdict: every declared run) loaded
    as the warehouse loads them, from the feature shards of the feature params only (a ``log`` line per folder of
    others; diagrams are not read), analysed; ``<out>/<table>.parquet`` and ``metrics`` written. Returns a summary.

    The metrics are computed from the tables as read back from their Parquet files: what the warehouse will hold.
    """
    digest, cons = params_digest(params.features), {}
    for scope, names in (("all", params.run_names()), ("variant", params.run_names(params.analysis.variant))):
        inputs = warehouse.discover_inputs(configs, runs, corpus, features, runs=names, feature_params=digest)
        for line in inputs.not_read if scope == "variant" else []:
            log(f"analysis: {line}")
        cons[scope] = duckdb.connect()
        warehouse.populate(cons[scope], dataclasses.replace(inputs, diagram_files=[]), params.analysis.settings(), {})
    con = cons["variant"]  # the paper's analysis is of one recipe variant at a time
    tables = analysis.run_analysis(con, params.analysis) | analysis.between_run_tables(cons["all"], params.analysis)
    Path(out).mkdir(parents=True, exist_ok=True)
    for name, frame in tables.items():
        write_parquet(Path(out) / f"{name}.parquet", frame)
        warehouse.load_parquet(con, name, [Path(out) / f"{name}.parquet"])
    Path(metrics).parent.mkdir(parents=True, exist_ok=True)
    write_text(metrics, metrics_json(build_metrics(con, params.analysis)))
    failed = tables["predictions"].query("status == 'failed'")
    return f"{len(tables['predictions'])} predictions ({len(failed)} failed)"


def build_metrics(con, params: AnalysisParams) -> dict:
    """The small nested metrics file compared by ``dvc metrics diff`` (needs the analysis tables loaded)."""
    final = con.execute(
        f"""SELECT rung, any_value(n_params) AS n_params, avg(val_loss) AS final_val_loss, count(*) AS n_seeds
           FROM final_checkpoints WHERE kind = 'ladder' AND (rung, seed) NOT IN ({DIVERGED})
           GROUP BY rung ORDER BY n_params, rung"""
    ).df()
    rho = con.execute(
        "SELECT rung, feature, avg(rho) AS rho FROM feature_loss_spearman WHERE layer = 'all' GROUP BY ALL"
    ).df()
    phases = con.execute(
        "SELECT rung, avg(peak_fraction) AS p, avg(diminishing_fraction) AS d FROM phases GROUP BY rung"
    ).df()
    across = con.execute(
        """SELECT rung, feature, estimate, ci_low, ci_high, n FROM tests
           WHERE kind = 'spearman_across_seeds' AND layer = 'all' ORDER BY feature"""
    ).df()
    rungs = {}
    for r in final.itertuples(index=False):
        headline = rho[(rho["rung"] == r.rung) & rho["feature"].isin(params.headline_features)]
        entry = {"n_params": _num(r.n_params), "final_val_loss": _num(r.final_val_loss), "n_seeds": int(r.n_seeds)}
        entry["rho"] = {name: _num(v) for name, v in sorted(zip(headline["feature"], headline["rho"], strict=True))}
        spread = across[(across["rung"] == r.rung) & across["feature"].isin(params.headline_features)]
        if len(spread):  # several seeds: the mean rho and its t-interval over seeds
            entry["rho_across_seeds"] = {t.feature: _interval(t) for t in spread.itertuples(index=False)}
        ph = phases[phases["rung"] == r.rung]
        if len(ph):
            entry["phase"] = {"peak_fraction": _num(ph["p"].iloc[0]), "diminishing_fraction": _num(ph["d"].iloc[0])}
        rungs[r.rung] = entry
    out = {"corpus": _corpus(con), "rungs": rungs, "prediction": _prediction_metrics(con), "scaling": _scaling(con)}
    if con.execute("SELECT count(*) FROM incremental_validity").fetchone()[0]:
        out["verdict"] = verdict.verdict_metrics(con.execute("SELECT * FROM topology_verdict ORDER BY ALL").df())
    diverged = diverged_runs(con)
    if len(diverged):  # left out of every number above
        out["diverged"] = {f"{r.rung}-{r.seed}": r.status_reason for r in diverged.itertuples(index=False)}
    return out


def metrics_json(metrics: dict) -> str:
    """Stable text of the metrics file (sorted keys, so unchanged numbers give an unchanged file)."""
    return json.dumps(metrics, indent=2, sort_keys=True) + "\n"


def _corpus(con) -> dict:
    row = con.execute(
        "SELECT any_value(corpus_used), any_value(corpus_fallback) FROM runs WHERE corpus_used IS NOT NULL"
    ).fetchone()
    return {"used": row[0], "fallback": row[1]} if row and row[0] is not None else {"used": None}


def _prediction_metrics(con) -> dict:
    mae = con.execute("SELECT * FROM prediction_mae ORDER BY method, cv, fraction").df()
    out: dict[str, dict] = {"mae": {}, "improvement_pct": {}}
    for r in mae.itertuples(index=False):
        name = r.method if r.cv in ("none", "rung") else f"{r.method}_cv_{r.cv}"
        key = f"f{round(100 * r.fraction):02d}"
        out["mae"].setdefault(name, {})[key] = _num(r.mae)
        if r.method != LOSS_ONLY:
            out["improvement_pct"].setdefault(name, {})[key] = _num(r.improvement_pct)
    across = con.execute(
        "SELECT other, estimate, ci_low, ci_high, n FROM tests WHERE kind = 'mae_across_seeds' ORDER BY other"
    ).df()
    for t in across.itertuples(index=False):  # other = method/cv/fraction (see across_seed_tests)
        method, cv, fraction = t.other.split("/")
        name = method if cv in ("none", "rung") else f"{method}_cv_{cv}"
        key = f"f{round(100 * float(fraction)):02d}"
        out.setdefault("mae_across_seeds", {}).setdefault(name, {})[key] = _interval(t)
    return out


def _interval(row) -> dict:
    """Mean over seeds with its Student-t 95% interval (tests.estimate/ci_low/ci_high) and the number of seeds."""
    return {"mean": _num(row.estimate), "ci_low": _num(row.ci_low), "ci_high": _num(row.ci_high), "n_seeds": int(row.n)}


def _scaling(con) -> dict:
    fits = con.execute("SELECT target, b, r2, spearman_rho, status FROM fits WHERE kind = 'scaling'").df()
    out = {}
    for r in fits.itertuples(index=False):
        out[r.target] = {"exponent": _num(r.b), "r2": _num(r.r2), "spearman_rho": _num(r.spearman_rho)}
        if r.status != "ok":
            out[r.target]["failed"] = True
    return out


def _num(value) -> float | None:
    """A JSON-friendly number: 6 significant digits, None for missing/NaN (JSON has no NaN)."""
    if value is None or pd.isna(value):
        return None
    return float(f"{float(value):.6g}")
