"""Within-run correlations that control for training progress: partial Spearman rho per run.

Within one run the validation loss falls while the weights grow, so any feature that grows with
training correlates with the loss (rho(vr_tp0, loss) = rho(w_fro, loss) = -1.000 on the default
ladder). The partial rho asks what a feature tracks *beyond* progress: rho(feature, val_loss | w_fro)
with the network's weight norm partialled out, and rho(feature, val_loss | step) with the step.
Pure functions over DataFrames; the statistic is :func:`topometrics.analysis.stats.partial_spearman`.
"""

from __future__ import annotations

import pandas as pd

from topometrics.analysis import stats

CONTROLS = ("w_fro", "step")  # the weight norm (layer 'all') and the training step
COLUMNS = ["kind", "rung", "seed", "feature", "layer", "other", "estimate", "ci_low", "ci_high", "p_value", "n"]


def partial_spearman_tests(frame: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Partial Spearman rho of every feature with the loss, given each control, per run.

    Parameters
    ----------
    frame : DataFrame
        One row per checkpoint and feature: ``rung, seed, step, feature, layer, value, val_loss, w_fro``
        (``w_fro`` = the checkpoint's layer-'all' weight norm).
    n_boot, seed : bootstrap resamples and seed of the CIs

    Returns
    -------
    DataFrame
        Rows of the ``tests`` table: ``kind = 'partial_spearman'``, ``other`` = the control, estimate =
        partial rho with its bootstrap CI and t-test p, ``reason`` when undefined or 0 by definition.
        The control itself gets no row (its partial rho given itself is meaningless).
    """
    rows = []
    for (rung, run_seed, feature, layer), g in frame.groupby(["rung", "seed", "feature", "layer"], sort=True):
        for control in CONTROLS:
            if feature == control:
                continue
            r = stats.partial_spearman(g["value"], g["val_loss"], g[control], n_boot, seed)
            rows.append(
                {"kind": "partial_spearman", "rung": rung, "seed": run_seed, "feature": feature, "layer": layer}
                | {"other": control, "estimate": r.rho, "ci_low": r.ci_low, "ci_high": r.ci_high}
                | {"p_value": r.p_value, "n": r.n, "reason": r.reason}
            )
    return pd.DataFrame(rows, columns=[*COLUMNS, "reason"])
