"""Scaling up as a decision: from the first part of a larger rung's runs, which recipe to carry on with, and
how much the larger rung gains over the smaller one it would replace.

The verdict's leave-one-rung-out predictions (cv ``rung``, between cells) are made for a rung whose runs no
fitted model has seen: its predictor was fitted on the other rungs only, and reads the held-out rung's
first ``fraction`` of training. That is the researcher's position after starting a larger model with a few
recipes: which one will end best, and is the larger model worth its compute? For every fraction, predictor
and held-out rung (:func:`rung_decision`):

- ``chosen``: the recipe with the lowest predicted final loss (the mean over its seeds); ``winner``: the
  recipe with the lowest actual final loss (mean over the same seeds); ``hit`` = 1 when they are the same;
- ``regret``: the chosen recipe's actual final loss minus the winner's (>= 0; the analysis loss unit);
- ``gain_predicted`` / ``gain_actual``: the next smaller rung's best actual final loss (a finished rung)
  minus the held-out rung's predicted final loss of ``chosen`` / actual final loss of ``winner``: how much
  scaling up was predicted to buy, and bought (NaN for the smallest rung).

``scale_up_table`` stacks them (table ``scale_up``); the ``scale_up_decisions`` view sums them per fraction
and predictor (hits, mean and largest regret). With three to five rungs there are two to five decisions
per predictor, too few for a test: the view's rows are descriptive and say so. The rung order is the parameter count's.

Pure functions of DataFrames.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

SCALE_UP_COLUMNS = [
    "fraction", "predictor", "kind", "rung", "smaller", "n_recipes", "n_runs", "chosen", "winner", "hit",
    "regret", "predicted_best", "actual_chosen", "actual_winner", "gain_predicted", "gain_actual", "status",
    "reason",
]  # fmt: skip
MIN_RECIPES = 2  # a choice needs two recipes at the held-out rung


def rung_decision(runs: pd.DataFrame, smaller_best: float) -> dict:
    """One held-out rung's decision from its runs' predictions.

    Parameters
    ----------
    runs : DataFrame
        One row per run of the rung: ``variant`` (the recipe), ``predicted`` and ``actual`` final loss.
        Rows with a non-finite value are left out.
    smaller_best : float
        The next smaller rung's lowest recipe-mean actual final loss (NaN when there is none).

    Returns
    -------
    dict
        The :data:`SCALE_UP_COLUMNS` that describe the decision (``status`` 'ok' or 'skipped' with a reason).
    """
    ok = runs[np.isfinite(runs[["predicted", "actual"]].to_numpy(float)).all(axis=1)]
    means = ok.groupby("variant")[["predicted", "actual"]].mean().sort_index()
    out = {"n_recipes": len(means), "n_runs": len(ok)}
    if len(means) < MIN_RECIPES:
        why = f"{len(means)} recipe with a prediction at this rung; a choice needs {MIN_RECIPES}"
        return out | {"status": "skipped", "reason": why}
    chosen, winner = means["predicted"].idxmin(), means["actual"].idxmin()
    out |= {"chosen": chosen, "winner": winner, "hit": float(chosen == winner)}
    out |= {"regret": float(means.at[chosen, "actual"] - means.at[winner, "actual"])}
    out |= {"predicted_best": float(means.at[chosen, "predicted"]), "actual_chosen": float(means.at[chosen, "actual"])}
    out |= {"actual_winner": float(means.at[winner, "actual"])}
    out |= {"gain_predicted": smaller_best - out["predicted_best"], "gain_actual": smaller_best - out["actual_winner"]}
    return out | {"status": "ok"}


def scale_up_table(predicted: pd.DataFrame, rung_sizes: dict[str, float]) -> pd.DataFrame:
    """The ``scale_up`` table: :func:`rung_decision` for every fraction x predictor x held-out rung of the
    verdict's leave-one-rung-out, between-cell predictions.

    ``predicted``: :func:`topometrics.verdict.intervals.predictors`' rows (``cv``, ``level``, ``fraction``,
    ``predictor``, ``kind``, ``rung``, ``variant``, ``seed``, ``actual``, ``predicted``); ``rung_sizes``: rung ->
    parameter count (the order of the ladder; a rung without one sorts last).
    """
    if predicted.empty:
        return pd.DataFrame(columns=SCALE_UP_COLUMNS)
    level = predicted["level"].fillna("between") if "level" in predicted else "between"
    held_out = predicted[(predicted["cv"] == "rung") & (level == "between")]
    held_out = held_out.assign(variant=held_out["variant"].fillna("base"))
    order = sorted(held_out["rung"].unique(), key=lambda r: (rung_sizes.get(r) is None, rung_sizes.get(r), r))
    best_actual = _best_actual(held_out)
    rows = []
    for (fraction, name), g in held_out.groupby(["fraction", "predictor"], sort=True):
        for i, rung in enumerate(order):
            smaller = order[i - 1] if i else None
            here = rung_decision(g[g["rung"] == rung], best_actual.get((fraction, smaller), np.nan))
            rows.append({"fraction": fraction, "predictor": name, "kind": g["kind"].iloc[0], "rung": rung,
                         "smaller": smaller} | here)  # fmt: skip
    return pd.DataFrame(rows).reindex(columns=SCALE_UP_COLUMNS)


def _best_actual(held_out: pd.DataFrame) -> dict:
    """(fraction, rung) -> the lowest recipe-mean actual final loss at that rung (the same for every
    predictor; the first predictor's runs are used)."""
    out = {}
    for (fraction, rung), g in held_out.groupby(["fraction", "rung"], sort=True):
        first = g[g["predictor"] == g["predictor"].iloc[0]]
        out[(fraction, rung)] = float(first.groupby("variant")["actual"].mean().min())
    return out
