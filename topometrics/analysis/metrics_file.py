"""The analysis stage's outputs: its tables as Parquet for the warehouse stage, and metrics.json, the headline
of them that ``dvc exp show`` and ``dvc metrics diff`` compare (a column per rung at most)."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import duckdb
import pandas as pd
from threadpoolctl import threadpool_limits

from topometrics.analysis import predict, warehouse
from topometrics.analysis import tables as analysis
from topometrics.analysis.tables import DIVERGED, diverged_runs
from topometrics.atomic import write_parquet, write_text
from topometrics.execution.shards import params_digest
from topometrics.params import AnalysisParams, Params
from topometrics.verdict import live, verdict

# Declared runs from which the verdict's comparisons go to a process pool: a 96-run sweep's 409 comparisons take
# about 0.5 s each on one thread, a small test project's a few milliseconds beside a worker's 1-2 s start.
POOL_MIN_RUNS = 32


def write_analysis(params: Params, sources: warehouse.Sources, out: Path, metrics: Path, log=print) -> str:
    """The analysis stage: the runs of ``analysis.variant`` (the between-run verdict: every declared run) loaded
    as the warehouse loads them, from the feature shards of the feature params only (a ``log`` line per folder of
    others; diagrams are not read), analysed; ``<out>/<table>.parquet`` and ``metrics`` written. Returns a summary.

    The metrics are computed from the tables as read back from their Parquet files: what the warehouse will hold.
    """
    digest, cons = params_digest(params.features), {}
    for scope, names in (("all", params.run_names()), ("variant", params.run_names(params.analysis.variant))):
        inputs = warehouse.discover_inputs(sources, runs=names, feature_params=digest)
        for line in inputs.not_read if scope == "variant" else []:
            log(f"analysis: {line}")
        cons[scope] = duckdb.connect()
        warehouse.populate(cons[scope], dataclasses.replace(inputs, diagram_files=[]), params.analysis.settings(), {})
    con = cons["variant"]  # the paper's analysis is of one recipe variant at a time
    # one BLAS thread: the verdict's refits are thousands of small least-squares and eigen problems, where a
    # second thread only contends (a stack's least-squares solve took 29 ms on two threads beside another
    # process against 0.1 ms on one)
    with threadpool_limits(limits=1):
        tables = analysis.run_analysis(con, params.analysis)
        tables |= analysis.between_run_tables(cons["all"], params.analysis, comparisons_map(len(params.runs())))
    Path(out).mkdir(parents=True, exist_ok=True)
    inputs = tables.pop("verdict_inputs")  # the live forecaster's runs: one JSON file, no pickle
    corpus = sources.corpus_source
    source = json.loads(Path(corpus).read_text()) if corpus is not None and Path(corpus).exists() else {}
    forecaster = live.forecaster_file(inputs, source, params.analysis.loss_unit)
    write_text(Path(out) / "live_forecast.json", json.dumps(forecaster, indent=1, sort_keys=True) + "\n")
    for name, frame in tables.items():
        write_parquet(Path(out) / f"{name}.parquet", frame)
        warehouse.load_parquet(con, name, [Path(out) / f"{name}.parquet"])
    Path(metrics).parent.mkdir(parents=True, exist_ok=True)
    write_text(metrics, metrics_json(build_metrics(con, params.analysis)))
    return predict.prediction_summary(tables["predictions"])


def comparisons_map(runs: int):
    """Where the verdict's comparisons run: from :data:`POOL_MIN_RUNS` declared runs, the execution seam's
    process pool over this machine's usable cores (each comparison on one BLAS thread, so the numbers are the
    same as here); with fewer, here (None), where a comparison takes milliseconds and a worker's start seconds."""
    if runs < POOL_MIN_RUNS:
        return None
    from topometrics.execution import compute  # only here: its torch import is 1.6 s of a small analysis

    return functools.partial(compute.map_jobs, workers=compute.usable_cores(), label="verdict", unit="comparisons")


def build_metrics(con, params: AnalysisParams) -> dict:
    """The headline that ``dvc exp show`` and ``dvc metrics diff`` compare (needs the analysis tables loaded).

    A column per rung at most, never one per run, so an experiment's row stays readable however many
    seeds and variants it trains: ``final_val_loss.<rung>`` (mean over the rung's seeds, diverged runs
    left out), ``rho.<feature>`` (mean over runs of the layer-'all' rho with the validation loss, for
    ``analysis.headline_features``), ``verdict`` (:func:`topometrics.verdict.verdict.verdict_metrics`),
    the counts of ``runs`` and ``diverged_runs``, and the ``corpus``. Every other number (per run, per
    method, per fraction, intervals over seeds, fits) is a table or view of the warehouse.
    """
    final = con.execute(
        f"""SELECT rung, any_value(n_params) AS n_params, avg(loss) AS final_val_loss
           FROM final_checkpoints WHERE kind = 'ladder' AND (rung, seed) NOT IN ({DIVERGED})
           GROUP BY rung ORDER BY n_params, rung"""
    ).df()
    rho = con.execute(
        """SELECT feature, avg(rho) AS rho FROM feature_loss_spearman
           WHERE layer = 'all' AND rho IS NOT NULL GROUP BY feature"""
    ).df()
    rho = rho[rho["feature"].isin(params.headline_features)]
    runs = con.execute("SELECT count(*) FROM runs WHERE kind = 'ladder'").fetchone()[0]
    out = {
        "corpus": _corpus(con),
        "final_val_loss": {r.rung: _num(r.final_val_loss) for r in final.itertuples(index=False)},
        "rho": {r.feature: _num(r.rho) for r in rho.sort_values("feature").itertuples(index=False)},
        "runs": int(runs),
        "diverged_runs": len(diverged_runs(con)),  # named, with the reason, in the report and the runs table
    }
    if con.execute("SELECT count(*) FROM incremental_validity").fetchone()[0]:
        out["verdict"] = verdict.verdict_metrics(con.execute("SELECT * FROM topology_verdict ORDER BY ALL").df())
    return out


def metrics_json(metrics: dict) -> str:
    """Stable text of the metrics file (sorted keys, so unchanged numbers give an unchanged file)."""
    return json.dumps(metrics, indent=2, sort_keys=True) + "\n"


def _corpus(con) -> dict:
    row = con.execute(
        "SELECT any_value(corpus_used), any_value(corpus_fallback) FROM runs WHERE corpus_used IS NOT NULL"
    ).fetchone()
    return {"used": row[0], "fallback": row[1]} if row and row[0] is not None else {"used": None}


def _num(value) -> float | None:
    """A JSON-friendly number: 6 significant digits, None for missing/NaN (JSON has no NaN)."""
    if value is None or pd.isna(value):
        return None
    return float(f"{float(value):.6g}")
