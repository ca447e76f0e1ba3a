"""The verdict turned into the researcher's decisions: prediction intervals, stopping and scaling up.

:func:`decision_tables` reads each run's training steps and each rung's size from the populated warehouse
connection and returns the ``prediction_intervals`` (:mod:`topometrics.verdict.intervals`), ``stopping``
(:mod:`topometrics.verdict.stopping`) and ``scale_up`` (:mod:`topometrics.verdict.scale_up`) tables from
the verdict's own inputs, rows and per-run predictions.
No file is read or written here.
"""

from __future__ import annotations

import pandas as pd

from topometrics.params import AnalysisParams
from topometrics.verdict import intervals, scale_up, stopping


def decision_tables(con, inputs: pd.DataFrame, validity: pd.DataFrame, errors: pd.DataFrame,
                    params: AnalysisParams) -> dict[str, pd.DataFrame]:  # fmt: skip
    """``prediction_intervals``, ``stopping`` and ``scale_up`` over the verdict's ``inputs`` (one row per run x
    fraction), its ``validity`` rows (their ``baseline`` names the predictors) and ``errors`` (per-run predictions)."""
    predicted = intervals.predictors(errors, validity)
    steps = con.execute(
        """SELECT r.rung, r.variant, r.seed, coalesce(r.steps, f.step) AS steps
           FROM runs r JOIN final_checkpoints f USING (rung, variant, seed)
           WHERE r.kind = 'ladder' ORDER BY ALL"""
    ).df()
    resampling = stopping.Resampling(params.alpha, params.bootstrap, params.seed)
    table = stopping.stopping_table(predicted, inputs, steps, params.fractions, resampling)
    sizes = dict(con.execute("SELECT rung, n_params FROM rungs WHERE n_params IS NOT NULL").fetchall())
    return {
        "prediction_intervals": intervals.interval_table(predicted),
        "stopping": table,
        "scale_up": scale_up.scale_up_table(predicted, sizes),
    }
