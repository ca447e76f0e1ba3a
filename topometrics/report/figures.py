"""The report's figures: chart frames shaped from the warehouse frames, drawn by ``topometrics.report.charts``,
and the long frames of the DVC plots."""

from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from topometrics.report import charts
from topometrics.report.frames import BETTI, Missing, ladder_only, rung_order_key, select_features
from topometrics.report.paper import PAPER_TABLE8
from topometrics.vocabulary import names

H0_TOTAL, H1_TOTAL, REP_W1_PREV = names("vr_tp0", "vr_tp1", "rep_w1_prev")
SCALING_FEATURES = ("val_loss", *names("vr_tp0", "vr_tp1", "np_norm", "np_sum", "rep_tp0"))


def figures(frames: dict[str, pd.DataFrame | Missing]) -> dict[str, alt.TopLevelMixin | Missing]:
    """Every figure of the report by file stem; a figure without data is :class:`Missing`."""
    ladder = {k: ladder_only(v) if isinstance(v, pd.DataFrame) and "kind" in v else v for k, v in frames.items()}
    feats = ladder["features"]
    out = {
        "loss_curves": _chart(charts.loss_curves, ladder["checkpoints"], "no checkpoints"),
        "np_evolution": _chart(charts.np_evolution, ladder["np"], "no neural persistence features"),
        "vr_evolution": _chart(
            charts.vr_evolution, select_features(feats, (H0_TOTAL, H1_TOTAL)), "no vr_tp0/vr_tp1 features"
        ),
        "tp0_vs_loss": _chart(charts.tp0_vs_loss, _tp0_loss(feats, ladder["checkpoints"]), "no vr_tp0 features"),
        "correlation_heatmap": _chart(charts.correlation_heatmap, _heatmap(frames["rho"]), "no correlations"),
        "prediction_comparison": _chart(charts.prediction_comparison, _mae(frames["mae"]), "no predictions"),
        "scaling": _scaling(frames["scaling"], frames["scaling_fits"]),
        "betti_curves": _chart(charts.betti_curves, _betti(feats), "no rep_betti* features"),
        "wasserstein_to_previous": _chart(
            charts.wasserstein_to_previous, select_features(feats, (REP_W1_PREV,)), "no rep_w1_prev features"
        ),
        "validation_series": _chart(
            charts.validation_series, _series(frames["np"], frames["features"]), "no external series"
        ),
    }
    return out


def dvc_plots(checkpoints, np_series) -> dict[str, pd.DataFrame]:
    """Long frames for ``dvc plots``: ``loss`` (step, rung, val_loss) and ``np`` (step, rung, np), ladder only."""
    out = {}
    for name, frame, value in (("loss", checkpoints, "val_loss"), ("np", np_series, "np")):
        if isinstance(frame, pd.DataFrame) and not frame.empty:
            long = ladder_only(frame).groupby(["step", "rung"], as_index=False)[value].mean()
            out[name] = long.sort_values(["rung", "step"], key=rung_order_key).reset_index(drop=True)
        else:
            out[name] = pd.DataFrame(columns=["step", "rung", value])
    return out


def _chart(function, frame, what: str):
    if isinstance(frame, Missing):
        return frame
    if frame is None or frame.empty:
        return Missing(what)
    return function(frame)


def _tp0_loss(features, checkpoints):
    if isinstance(features, Missing) or isinstance(checkpoints, Missing):
        return features if isinstance(features, Missing) else checkpoints
    tp0 = features[features["feature"] == H0_TOTAL][["rung", "seed", "step", "value"]].rename(
        columns={"value": H0_TOTAL}
    )
    return tp0.merge(checkpoints[["rung", "seed", "step", "val_loss"]], on=["rung", "seed", "step"])


def _heatmap(rho):
    if isinstance(rho, Missing):
        return rho
    # The Betti curves are curves, not summaries: one row per scale would swamp the map.
    summaries = rho[~rho["feature"].str.match(BETTI.pattern) & rho["rho"].notna()]
    return summaries.groupby(["rung", "feature"], as_index=False)["rho"].mean()


def _mae(mae):
    if isinstance(mae, Missing):
        return mae
    fitted = mae[mae["mae"].notna()]
    label = np.where(
        fitted["cv"].isin(["none", "rung"]), fitted["method"], fitted["method"] + " (cv " + fitted["cv"] + ")"
    )
    return fitted.assign(method=label)[["method", "fraction", "mae"]]


def _scaling(points, fits):
    if isinstance(points, Missing):
        return points
    final = points[points["feature"].isin(SCALING_FEATURES) & (points["value"] > 0)]
    if final.empty:
        return Missing("no positive final-checkpoint values for the scaling features")
    final = final.groupby(["rung", "n_params", "feature"], as_index=False)["value"].mean()
    return charts.scaling(final, _fitted_curves(fits, final))


def _fitted_curves(fits, points: pd.DataFrame) -> pd.DataFrame | None:
    if isinstance(fits, Missing):
        return None
    ok = fits[(fits["status"] == "ok") & fits["target"].isin(points["feature"].unique())].dropna(subset=["a", "b", "c"])
    grid = np.geomspace(points["n_params"].min(), points["n_params"].max(), 40)
    curves = [
        pd.DataFrame({"feature": fit.target, "n_params": grid, "value": fit.a * grid**fit.b + fit.c})
        for fit in ok.drop_duplicates("target").itertuples(index=False)
    ]
    if not curves:
        return None
    out = pd.concat(curves, ignore_index=True)
    return out[out["value"] > 0]


def _betti(features):
    if isinstance(features, Missing):
        return features
    parsed = features["feature"].str.extract(BETTI.pattern)
    curves = features.assign(dim="H" + parsed[0], scale=pd.to_numeric(parsed[1])).dropna(subset=["scale"])
    if curves.empty:
        return curves
    seed = curves.groupby("rung")["seed"].transform("min")
    curves = curves[curves["seed"] == seed]
    first, last = (curves.groupby("rung")["step"].transform(fn) for fn in ("min", "max"))
    curves = curves[(curves["step"] == first) | (curves["step"] == last)]
    label = np.where(curves["step"] == last.loc[curves.index], "final", "first")
    return curves.assign(checkpoint=label, betti=curves["value"])[["rung", "checkpoint", "dim", "scale", "betti"]]


def _series(np_series, features):
    if isinstance(np_series, Missing) or isinstance(features, Missing):
        return np_series if isinstance(np_series, Missing) else features
    ours_np = np_series[np_series["kind"] == "series"].assign(quantity="NP mean", value=lambda d: d["np"])
    ours_h0 = features[(features["kind"] == "series") & (features["feature"] == H0_TOTAL)].assign(quantity="H0 total")
    ours = pd.concat([ours_np, ours_h0], ignore_index=True)
    if ours.empty:
        return ours
    ours = ours.groupby(["step", "quantity"], as_index=False)["value"].mean().assign(source="ours")
    paper = PAPER_TABLE8.melt(id_vars="step", value_vars=["paper NP mean", "paper H0 total"], var_name="quantity")
    paper = paper.assign(quantity=paper["quantity"].str.removeprefix("paper "), source="paper")
    return pd.concat([ours, paper], ignore_index=True)
