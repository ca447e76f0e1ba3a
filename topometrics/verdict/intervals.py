"""Prediction intervals for every verdict predictor's out-of-fold final-loss prediction, and their coverage.

The predictors are the verdict's models (:func:`predictors`: every comparison's smaller model, named by its
baseline, and its larger one, the baseline + the family), read from the per-run ``incremental_errors`` rows
joined to their comparison's ``baseline``. This is the one place that names them: the stopping decisions
(:mod:`topometrics.verdict.stopping`) and the saved live predictor read the same list, so a new baseline in
the verdict (its ``baseline`` column) appears here without a change.

Interval (:func:`conformal_half_widths`): split conformal (Vovk et al. 2005; Lei et al. 2018) with the
cross-validation's own held-out residuals as the calibration set, per fold, as in CV+ (Barber et al. 2021,
"Predictive inference with the jackknife+", section 3): a run held out in fold k gets its out-of-fold
prediction +- the ceil(level (m + 1))-th smallest absolute held-out residual of the m runs of the *other*
folds (its own fold's residuals are never used; an infinite half-width when that rank exceeds m). Under
exchangeable runs the coverage is at least ``level`` up to the CV+ slack; :func:`coverage` measures it.

Pure functions of arrays and DataFrames.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

LEVELS = (0.8, 0.95)  # nominal coverages of the stored intervals
CURRENT = "current loss"  # rank by the last observed loss: successive halving's rule (not a final-loss prediction)
# Families whose larger model *is* a baseline: the weight norm over the loss curve is 'norm', the recipe over
# the norm is 'recipe' (the verdict's baselines table names the rest as '<baseline>+<family>').
COMPLETES = {"weight_norm": "norm", "recipe": "recipe"}
PREDICTOR_COLUMNS = [
    "cv", "level", "fraction", "predictor", "kind", "rung", "seed", "variant", "fold", "actual", "predicted",
]  # fmt: skip
INTERVAL_COLUMNS = PREDICTOR_COLUMNS + ["nominal", "half_width", "low", "high", "covered"]


def conformal_half_widths(residuals, folds, level: float) -> np.ndarray:
    """Per run, the half-width of its ``level`` interval from the held-out residuals of the other folds.

    Parameters
    ----------
    residuals : array_like, shape (n_runs,)
        Out-of-fold residuals, actual - predicted (nats); NaN rows are neither calibrated nor calibrate.
    folds : array_like, shape (n_runs,)
        The fold (held-out group) of each run.
    level : float in (0, 1)

    Returns
    -------
    ndarray, shape (n_runs,)
        The ceil(level (m + 1))-th smallest |residual| among the m finite runs outside the run's fold; inf when
        that rank exceeds m (too few runs for the level), NaN where the run's own residual is NaN.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    r, folds = np.abs(np.asarray(residuals, float)), np.asarray(folds)
    out = np.full(len(r), np.nan)
    for fold in np.unique(folds):
        mine = folds == fold
        others = np.sort(r[~mine & np.isfinite(r)])
        rank = math.ceil(level * (len(others) + 1))
        width = others[rank - 1] if rank <= len(others) else np.inf
        out[mine & np.isfinite(r)] = width
    return out


def predictors(errors: pd.DataFrame, validity: pd.DataFrame) -> pd.DataFrame:
    """Every verdict predictor's out-of-fold final-loss prediction per run, one row per (cv, level, fraction,
    predictor, run): :data:`PREDICTOR_COLUMNS`.

    ``predictor``: the comparison's baseline for its smaller model; ``<baseline>+<family>`` for the larger
    (:data:`COMPLETES` for the families that make a baseline; ``[primary]`` marks the pre-registered
    endpoint's feature subset). ``kind``: 'baseline' or 'family'. A predictor met in several comparisons (a
    baseline is the smaller model of every family's comparison) keeps the rows of the one with the most runs
    (the smaller model is refitted per comparison on the runs both models can use); one row per run.
    ``fold``: the run's held-out group (its value of the ``cv`` column).
    """
    if errors.empty:
        return pd.DataFrame(columns=PREDICTOR_COLUMNS)
    errors = errors.assign(level=errors.get("level", "between"))
    keys = ["cv", "level", "fraction", "family", "comparison"]
    base = validity.assign(level=validity.get("level", "between"))[[*keys, "baseline"]]
    joined = errors.merge(base.drop_duplicates(keys), on=keys, how="left")
    baselines = set(joined["baseline"].dropna()) | set(COMPLETES.values())
    parts = []
    for model in ("without", "with"):
        names = joined["baseline"] if model == "without" else joined.apply(_larger_name, axis=1)
        part = joined.assign(predictor=names, predicted=joined[f"predicted_{model}"], fold=_folds(joined))
        parts.append(part.assign(kind=np.where(part["predictor"].isin(baselines), "baseline", "family")))
    long = pd.concat(parts, ignore_index=True)
    size = long.groupby([*keys, "predictor"])["predicted"].transform("size")
    # one comparison per predictor: the smaller model of '(3) vs recipe' is the same predictor for every family
    # compared with the recipe baseline, so the comparison is named by its family as well
    long = long.assign(_size=size, _which=long["family"].astype(str) + "|" + long["comparison"].astype(str))
    long = long.sort_values(["_size", "comparison", "family"], ascending=[False, True, True], kind="stable")
    first = long.groupby(["cv", "level", "fraction", "predictor"])["_which"].transform("first")
    long = long[long["_which"] == first]
    return long.reindex(columns=PREDICTOR_COLUMNS).sort_values(PREDICTOR_COLUMNS[:7]).reset_index(drop=True)


def _larger_name(row) -> str:
    if row["comparison"] == "primary":
        return f"{row['baseline']}+{row['family']}[primary]"
    return COMPLETES.get(row["family"]) or f"{row['baseline']}+{row['family']}"


def _folds(frame: pd.DataFrame) -> pd.Series:
    """Each row's held-out group: its value of the column its ``cv`` names (seed, variant or rung)."""
    return pd.Series([str(r[r["cv"]]) for _, r in frame.iterrows()], index=frame.index, dtype=object)


def interval_table(predicted: pd.DataFrame, levels=LEVELS) -> pd.DataFrame:
    """The ``prediction_intervals`` table: every row of :func:`predictors` at each nominal ``level``, with its
    conformal half-width (:func:`conformal_half_widths`, calibrated within its cv x level x fraction x
    predictor), ``low``/``high`` and whether the final loss fell inside (``covered``)."""
    rows = []
    for _, g in predicted.groupby(["cv", "level", "fraction", "predictor"], sort=True):
        residual = (g["actual"] - g["predicted"]).to_numpy(float)
        for nominal in levels:
            half = conformal_half_widths(residual, g["fold"].to_numpy(), nominal)
            low, high = g["predicted"].to_numpy(float) - half, g["predicted"].to_numpy(float) + half
            covered = np.where(np.isfinite(half), (g["actual"] >= low) & (g["actual"] <= high), np.nan)
            rows.append(g.assign(nominal=nominal, half_width=half, low=low, high=high, covered=covered))
    if not rows:
        return pd.DataFrame(columns=INTERVAL_COLUMNS)
    return pd.concat(rows, ignore_index=True).reindex(columns=INTERVAL_COLUMNS)
