"""The report's data: the warehouse queries, and the helpers that shape their frames.

:func:`load` runs :data:`QUERIES` on a DuckDB connection (open it ``read_only=True``) into
DataFrames; a table or view the warehouse lacks, or an empty one, becomes :class:`Missing` with
its reason, never an exception.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import duckdb
import pandas as pd

from topometrics.report import charts

BETTI = re.compile(r"^rep_betti(\d)_(\d+)$")  # the per-scale names of the rep_betti0 / rep_betti1 curves

# The report shows the runs of the recipe variant the analysis tables were computed for (analysis.variant).
ANALYSED = "variant = (SELECT coalesce(any_value(variant), 'base') FROM predictions)"
# The validation loss in analysis.loss_unit (nats per token, or bits per UTF-8 byte), and the unit's name.
UNIT = "(SELECT any_value(loss_unit) FROM settings)"
LOSS = f"CASE WHEN {UNIT} = 'bpb' THEN c.val_bpb ELSE c.val_loss END AS val_loss, {UNIT} AS loss_unit"
QUERIES = {
    "runs": f"SELECT * FROM runs WHERE {ANALYSED} ORDER BY kind, rung, seed",
    "meta": "SELECT key, value FROM meta",
    "rungs": "SELECT * FROM rungs",
    "checkpoints": f"""SELECT c.rung, c.seed, c.step, {LOSS}, g.kind FROM checkpoints c JOIN rungs g USING (rung)
                       WHERE {ANALYSED}""",
    "final": f"""SELECT rung, seed, step, loss AS val_loss, {UNIT} AS loss_unit, n_params, kind, complete
                 FROM final_checkpoints WHERE {ANALYSED}""",
    "features": f"""SELECT f.rung, f.seed, f.step, f.feature, f.value, g.kind FROM features f JOIN rungs g USING (rung)
                   WHERE f.layer = 'all' AND f.value IS NOT NULL AND NOT isnan(f.value) AND {ANALYSED}""",
    "np": f"SELECT n.rung, n.seed, n.step, n.np, g.kind FROM np_series n JOIN rungs g USING (rung) WHERE {ANALYSED}",
    "rho": f"""SELECT s.rung, s.seed, s.feature, s.loss, s.n, s.rho, g.kind FROM feature_loss_spearman s
              JOIN rungs g USING (rung) WHERE s.layer = 'all' AND {ANALYSED}""",
    "spearman": "SELECT * FROM tests WHERE kind = 'spearman' AND layer = 'all'",
    "topo_vs_spectral": "SELECT * FROM tests WHERE kind = 'topo_vs_spectral'",
    "mae": "SELECT * FROM prediction_mae",
    "predictions": "SELECT status, reason FROM predictions",
    "phases": f"SELECT * FROM phases WHERE {ANALYSED}",
    "changepoints": f"""SELECT rung, seed, series, first_step, count, np_threshold_step, lag_vs_val_loss, lag_vs_lr,
                       reason FROM changepoints WHERE {ANALYSED}""",
    "early_stopping": f"SELECT * FROM early_stopping WHERE {ANALYSED}",
    "scaling": f"SELECT * FROM scaling WHERE kind = 'ladder' AND layer IN ('all', 'checkpoint') AND {ANALYSED}",
    "scaling_fits": "SELECT * FROM fits WHERE kind = 'scaling'",
    "verdict": "SELECT * FROM topology_verdict ORDER BY cv, fraction, family",
    "partial": "SELECT * FROM partial_spearman WHERE layer = 'all'",
    "stopping": "SELECT * FROM stopping_decisions ORDER BY cv, fraction, scope, kill_share, predictor",
    "coverage": "SELECT * FROM interval_coverage ORDER BY cv, level, fraction, predictor, nominal",
}


@dataclass(frozen=True)
class Missing:
    """A table or figure that cannot be shown, and why."""

    reason: str


# --- queries ---------------------------------------------------------------------------------------


def load(con: duckdb.DuckDBPyConnection) -> dict[str, pd.DataFrame | Missing]:
    """Run every query in :data:`QUERIES`; a table or view the warehouse lacks becomes :class:`Missing`."""
    frames = {}
    for name, sql in QUERIES.items():
        try:
            frames[name] = con.execute(sql).df()
        except (duckdb.CatalogException, duckdb.BinderException) as err:
            frames[name] = Missing(f"the warehouse cannot answer `{name}` ({str(err).splitlines()[0]})")
    return frames


def need(frame, name: str):
    """An empty table becomes :class:`Missing` with the stage that fills it."""
    if isinstance(frame, pd.DataFrame) and frame.empty:
        return Missing(f"`{name}` is empty ({FILLED_BY.get(name, 'an earlier stage has not run')})")
    return frame


FILLED_BY = {
    "features": "the features stage has not run",
    "np": "no neural-persistence features yet",
    "rho": "no features yet",
    "spearman": "the analysis stage has not filled `tests`",
    "topo_vs_spectral": "no spectral features, or the analysis stage has not run",
    "mae": "the analysis stage has not filled `predictions`",
    "scaling_fits": "the analysis stage has not filled `fits`",
    "phases": "no neural-persistence features yet",
    "changepoints": "the analysis stage has not filled the changepoint tests",
    "verdict": "the analysis stage has not filled `incremental_validity`: too few runs, or an old warehouse",
    "partial": "the analysis stage has not filled the partial Spearman tests",
    "stopping": "the analysis stage has not filled `stopping`: no run observed at a fraction",
    "coverage": "no verdict predictions to put intervals on: too few runs for the verdict",
}


def ladder_only(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["kind"] == "ladder"] if "kind" in frame else frame


def rung_order_key(col: pd.Series) -> pd.Series:
    if col.name != "rung":
        return col
    domain = charts.rung_domain(col)
    return col.map({r: i for i, r in enumerate(domain)})


def ordered(frame, extra: list[str] | None = None):
    if isinstance(frame, Missing) or "rung" not in frame:
        return frame
    keys = ["rung"] + [c for c in ("seed", *(extra or [])) if c in frame]
    return frame.sort_values(keys, key=rung_order_key).reset_index(drop=True)


def select_features(features, names: tuple[str, ...]):
    if isinstance(features, Missing):
        return features
    return features[features["feature"].isin(names)]


def wide_features(features: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    chosen = features[features["feature"].isin(names)]
    wide = chosen.pivot_table(index=["rung", "step"], columns="feature", values="value", aggfunc="mean")
    return wide.reindex(columns=names).reset_index()
