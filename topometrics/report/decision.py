"""The decision on the report's first screen: compute saved against regret when the worst runs are stopped early,
for the best baseline and the best family, and the measured coverage of the prediction intervals.

Reads the ``stopping_decisions`` and ``interval_coverage`` views (:mod:`topometrics.verdict.stopping`,
:mod:`topometrics.verdict.intervals`); pure functions from their frames to an ``alt.Chart`` and tables.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from topometrics.report.charts import _chart
from topometrics.report.frames import Missing

SCOPE = "sweep"  # the curve's scope: the worst share of all runs stopped (successive halving's rung)


def best_pair(stopping: pd.DataFrame) -> pd.DataFrame | Missing:
    """The ok ``sweep`` rows of the best baseline and the best family (lowest mean gap over the kill shares and
    fractions, ties by fewer wrong kills) of the cv that ranks the most runs."""
    if isinstance(stopping, Missing):
        return stopping
    ok = stopping[(stopping["status"] == "ok") & (stopping["scope"] == SCOPE)]
    if ok.empty:
        reasons = stopping["reason"].dropna()
        return Missing(reasons.iloc[0] if len(reasons) else "no stopping decision could be computed")
    cv = ok.groupby("cv")["n"].max().sort_values(ascending=False, kind="stable").index[0]
    ok = ok[ok["cv"] == cv]
    score = ok.groupby(["kind", "predictor"])[["gap", "wrong_kills"]].mean().reset_index()
    best = score.sort_values(["gap", "wrong_kills", "predictor"]).groupby("kind").head(1)["predictor"]
    return ok[ok["predictor"].isin(best)].reset_index(drop=True)


def stopping_curve(stopping: pd.DataFrame | Missing) -> alt.Chart | Missing:
    """Compute saved (x) against regret (y: the share of cell-bootstrap sweeps that stop the eventual best run),
    one line per predictor and fraction through the kill shares, with the gap in the tooltip."""
    pair = best_pair(stopping)
    if isinstance(pair, Missing):
        return pair
    frame = pair.assign(label=pair["predictor"] + " (" + pair["kind"] + ")", at=(100 * pair["fraction"]).round())
    title = f"Stopping the worst runs early: compute saved vs regret (cv: {pair['cv'].iloc[0]})"
    return (
        _chart(frame, title)
        .mark_line(point=True)
        .encode(
            x=alt.X("saved:Q", title="share of training steps saved", scale=alt.Scale(domain=[0, 1])),
            y=alt.Y("p_best_killed:Q", title="P(the eventual best run is stopped)", scale=alt.Scale(domain=[0, 1])),
            color=alt.Color("label:N", title="ranked by"),
            strokeDash=alt.StrokeDash("at:O", title="stopped at % of training"),
            detail="fraction:Q",
            tooltip=[
                "label:N",
                "fraction:Q",
                "kill_share:Q",
                alt.Tooltip("saved:Q", format=".2f"),
                alt.Tooltip("p_best_killed:Q", format=".2f"),
                alt.Tooltip("gap:Q", format=".4f"),
                "decision:N",
            ],  # fmt: skip
        )
    )


def coverage_table(coverage: pd.DataFrame | Missing) -> pd.DataFrame | Missing:
    """Measured coverage of the 80 % and 95 % intervals beside the nominal, per cv x fraction x predictor."""
    if isinstance(coverage, Missing):
        return coverage
    wide = coverage.pivot_table(index=["cv", "fraction", "predictor", "kind"], columns="nominal",
                                values=["covered", "n"], aggfunc="first")  # fmt: skip
    wide.columns = [f"{'measured' if k == 'covered' else 'runs'} ({100 * level:.0f} %)" for k, level in wide.columns]
    return wide.reset_index()
