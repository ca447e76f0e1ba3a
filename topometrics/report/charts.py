"""The report's figures: pure functions from tidy DataFrames to ``alt.Chart`` objects.

No function here reads or writes a file; the report stage saves the charts (HTML, PNG, SVG).
Data is inlined as JSON records (``alt.Data(values=...)``), so a chart's ``to_dict()`` is the
complete Vega-Lite spec and needs no data transformer (nor altair's 5,000-row limit).

Every chart that shows rungs colours them with :func:`rung_color`: the rungs it shows, ladder order
tiny -> xl first, then any other rung (an external series such as ``EleutherAI/pythia-14m``); a rung
has the same colour in every figure, and a legend lists only the rungs present.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable

import altair as alt
import pandas as pd

from topometrics import vocabulary

RUNG_ORDER = ("tiny", "small", "medium", "large", "xl")
# Ladder colours light-to-dark would fade "tiny" into the background; these are Vega's
# tableau10 hues, fixed per rung, then extra hues for rungs outside the ladder.
RUNG_COLORS = ("#4c78a8", "#72b7b2", "#54a24b", "#f58518", "#e45756")
EXTRA_COLORS = ("#b279a2", "#9d755d", "#eeca3b", "#ff9da6", "#bab0ac")
WIDTH, HEIGHT = 320, 220


def rung_domain(rungs: Iterable[str]) -> list[str]:
    """The colour domain: the ladder rungs present in ladder order, then the other rungs sorted (a legend lists
    only what the chart shows)."""
    present = set(rungs)
    return [r for r in RUNG_ORDER if r in present] + sorted(present - set(RUNG_ORDER))


def rung_hue(rung: str) -> str:
    """A rung's fixed colour: its ladder hue, else an extra hue chosen by the name's CRC-32 (stable across charts
    and runs, unlike Python's salted ``hash``)."""
    if rung in RUNG_ORDER:
        return RUNG_COLORS[RUNG_ORDER.index(rung)]
    return EXTRA_COLORS[zlib.crc32(rung.encode()) % len(EXTRA_COLORS)]


def rung_color(rungs: Iterable[str], title: str = "rung") -> alt.Color:
    """``rung:N`` with the rungs present as its domain and a fixed hue per rung, so a rung keeps its colour across
    charts."""
    domain = rung_domain(rungs)
    return alt.Color("rung:N", scale=alt.Scale(domain=domain, range=[rung_hue(r) for r in domain]), sort=domain,
                     title=title)  # fmt: skip


def loss_curves(checkpoints: pd.DataFrame) -> alt.Chart:
    """Validation loss over training, one line per rung (and seed). Columns: rung, seed, step, val_loss."""
    _require(checkpoints, "loss_curves", ("rung", "seed", "step", "val_loss"))
    unit = "bits/byte" if "loss_unit" in checkpoints and (checkpoints["loss_unit"] == "bpb").any() else "nats/token"
    return _rung_lines(checkpoints, "val_loss", f"validation loss ({unit})", "Validation loss per rung")


def np_evolution(np_series: pd.DataFrame) -> alt.Chart:
    """Mean neural persistence over training per rung. Columns: rung, seed, step, np."""
    _require(np_series, "np_evolution", ("rung", "seed", "step", "np"))
    return _rung_lines(np_series, "np", "mean NP (normalised)", "Neural persistence (mean over layers)")


def _rung_lines(frame: pd.DataFrame, y: str, y_title: str, title: str) -> alt.Chart:
    """``y`` against step, one line per rung and seed, in the fixed rung colours."""
    return (
        _chart(frame, title)
        .mark_line()
        .encode(
            x=alt.X("step:Q", title="step"),
            y=alt.Y(f"{y}:Q", title=y_title, scale=alt.Scale(zero=False)),
            color=rung_color(frame["rung"]),
            detail="seed:N",
            tooltip=["rung:N", "seed:N", "step:Q", alt.Tooltip(f"{y}:Q", format=".4f")],
        )
    )


def vr_evolution(features: pd.DataFrame) -> alt.Chart:
    """Vietoris-Rips H0 and H1 total persistence over training, one panel per feature.

    Columns: rung, seed, step, feature (``vr_tp0``/``vr_tp1``), value. Panels have their own y scale.
    """
    _require(features, "vr_evolution", ("rung", "seed", "step", "feature", "value"))
    total = alt.Y("value:Q", title="total persistence (sum over layers)", scale=alt.Scale(zero=False))
    return _line_panels(
        features,
        "feature",
        "Vietoris-Rips total persistence of the weights",
        x=alt.X("step:Q", title="step"),
        y=total,
        color=rung_color(features["rung"]),
        detail="seed:N",
        tooltip=["rung:N", "seed:N", "step:Q", "feature:N", alt.Tooltip("value:Q", format=".4g")],
    )


def tp0_vs_loss(points: pd.DataFrame) -> alt.Chart:
    """H0 total persistence against validation loss, one point per checkpoint, coloured by rung.

    Columns: rung, seed, step, vr_tp0, val_loss.
    """
    _require(points, "tp0_vs_loss", ("rung", "seed", "step", "vr_tp0", "val_loss"))
    return (
        _chart(points, "H0 total persistence vs validation loss")
        .mark_circle(size=30, opacity=0.8)
        .encode(
            x=alt.X("vr_tp0:Q", title="VR H0 total persistence", scale=alt.Scale(zero=False)),
            y=alt.Y("val_loss:Q", title="validation loss", scale=alt.Scale(zero=False)),
            color=rung_color(points["rung"]),
            tooltip=["rung:N", "seed:N", "step:Q", alt.Tooltip("vr_tp0:Q", format=".4g"), "val_loss:Q"],
        )
    )


def correlation_heatmap(rho: pd.DataFrame) -> alt.VConcatChart:
    """Spearman rho(feature, validation loss) for every feature x rung, one panel per feature family, stacked (a
    map of ~150 features in one panel hid its column labels far above the reader). Columns: rung, feature, rho."""
    _require(rho, "correlation_heatmap", ("rung", "feature", "rho"))
    domain = [r for r in rung_domain(rho["rung"]) if r in set(rho["rung"])]
    frame = rho.assign(family=rho["feature"].map(feature_family))
    panels = [
        alt.Chart(_data(rows))
        .mark_rect()
        .encode(
            # every panel labels its columns at its top, next to the rows it explains
            x=alt.X("rung:N", sort=domain, title=None, axis=alt.Axis(orient="top", labelAngle=0)),
            y=alt.Y("feature:N", title=None),
            color=alt.Color("rho:Q", scale=alt.Scale(scheme="redblue", domain=[-1, 1]), title="rho"),
            tooltip=["rung:N", "feature:N", alt.Tooltip("rho:Q", format=".3f")],
        )
        # a fixed height per panel: Vega-Lite's step height inside a facet fails in the browser ("datum is not
        # defined"), so panels are concatenated, each sized to its own rows
        .properties(width=40 * max(len(domain), 1), height=12 * rows["feature"].nunique(), title=family)
        for family, rows in frame.groupby("family", sort=True)
    ]
    return alt.vconcat(*panels).properties(title="Spearman rho(feature, validation loss), by family")


def feature_family(name: str) -> str:
    """The family a ``feature`` column name is declared in (``vocabulary.lookup``), 'other' if undeclared."""
    feature = vocabulary.lookup(name)
    return feature.family.name if feature is not None else "other"


def prediction_comparison(mae: pd.DataFrame) -> alt.Chart:
    """Final-loss prediction MAE per method, grouped by training fraction. Columns: method, fraction, mae."""
    _require(mae, "prediction_comparison", ("method", "fraction", "mae"))
    return (
        _chart(mae, "Final-loss prediction error by training fraction")
        .mark_bar()
        .encode(
            x=alt.X("fraction:O", title="fraction of training observed", axis=alt.Axis(format=".0%")),
            xOffset=alt.XOffset("method:N"),
            y=alt.Y("mae:Q", title="MAE of final validation loss"),
            color=alt.Color("method:N", title="method"),
            tooltip=["method:N", alt.Tooltip("fraction:Q", format=".0%"), alt.Tooltip("mae:Q", format=".4f")],
        )
    )


def scaling(points: pd.DataFrame, fitted: pd.DataFrame | None = None) -> alt.Chart:
    """Final-checkpoint values against parameter count on log-log axes, one panel per feature.

    ``points``: rung, n_params, feature, value (positive values only: a log axis has no zero).
    ``fitted`` (optional): feature, n_params, value of the power-law fit a*N^b + c, drawn as a line.
    """
    _require(points, "scaling", ("rung", "n_params", "feature", "value"))
    x = alt.X("n_params:Q", title="parameters N", scale=alt.Scale(type="log"))
    y = alt.Y("value:Q", title="final value", scale=alt.Scale(type="log"))
    dots = (
        alt.Chart()
        .mark_circle(size=60)
        .encode(x=x, y=y, color=rung_color(points["rung"]), tooltip=["rung:N", "n_params:Q", "value:Q"])
    )
    layers = [dots]
    data = points.assign(layer="points")
    if fitted is not None and not fitted.empty:
        _require(fitted, "scaling (fitted)", ("feature", "n_params", "value"))
        line = alt.Chart().mark_line(color="gray", strokeDash=[4, 3]).encode(x=x, y=y)
        layers = [line.transform_filter("datum.layer == 'fit'"), dots.transform_filter("datum.layer == 'points'")]
        data = pd.concat([data, fitted.assign(layer="fit", rung=None)], ignore_index=True)
    return (
        alt.layer(*layers, data=_data(data))
        .properties(width=220, height=180)
        .facet(facet=alt.Facet("feature:N", title=None), columns=3)
        .resolve_scale(y="independent")
        .properties(title="Scaling with model size (log-log)")
    )


def betti_curves(curves: pd.DataFrame) -> alt.Chart:
    """Betti curves of the hidden-state cloud, one panel per dimension, dashed at the first checkpoint.

    Columns: rung, checkpoint (label, e.g. ``first``/``final``), dim (``H0``/``H1``), scale (index), betti.
    """
    _require(curves, "betti_curves", ("rung", "checkpoint", "dim", "scale", "betti"))
    return _line_panels(
        curves,
        "dim",
        "Representation topology: Betti curves of the hidden states",
        x=alt.X("scale:Q", title="filtration scale (index)"),
        y=alt.Y("betti:Q", title="Betti number"),
        color=rung_color(curves["rung"]),
        strokeDash=alt.StrokeDash("checkpoint:N", title="checkpoint"),
        tooltip=["rung:N", "checkpoint:N", "dim:N", "scale:Q", "betti:Q"],
    )


def wasserstein_to_previous(distances: pd.DataFrame) -> alt.Chart:
    """1-Wasserstein distance between consecutive checkpoints' diagrams. Columns: rung, seed, step, value."""
    _require(distances, "wasserstein_to_previous", ("rung", "seed", "step", "value"))
    return (
        _chart(distances, "Representation diagrams: W1 distance to the previous checkpoint")
        .mark_line(point=True)
        .encode(
            x=alt.X("step:Q", title="step"),
            y=alt.Y("value:Q", title="W1 to previous checkpoint"),
            color=rung_color(distances["rung"]),
            detail="seed:N",
            tooltip=["rung:N", "seed:N", "step:Q", alt.Tooltip("value:Q", format=".4g")],
        )
    )


def validation_series(series: pd.DataFrame) -> alt.Chart:
    """An external checkpoint series (e.g. Pythia) beside the paper's Table 8, one panel per quantity.

    Columns: step, quantity (e.g. ``NP mean``, ``H0 total``), value, source (``ours``/``paper``).
    """
    _require(series, "validation_series", ("step", "quantity", "value", "source"))
    base = (
        _chart(series, None)
        .mark_line(point=True)
        .encode(
            x=alt.X("step:Q", title="step"),
            y=alt.Y("value:Q", title=None, scale=alt.Scale(zero=False)),
            color=alt.Color("source:N", sort=["ours", "paper"], title="source"),
            tooltip=["source:N", "quantity:N", "step:Q", alt.Tooltip("value:Q", format=".4g")],
        )
    )
    return (
        base.facet(column=alt.Column("quantity:N", title=None))
        .resolve_scale(y="independent")
        .properties(title="Validation series across training")
    )


# --- helpers ---------------------------------------------------------------------------------------


def _data(frame: pd.DataFrame) -> alt.Data:
    # Through pandas' JSON writer: NaN becomes null (json.dumps would write invalid NaN) and
    # numpy scalars become plain numbers.
    return alt.Data(values=json.loads(frame.to_json(orient="records", double_precision=10)))


def _line_panels(frame: pd.DataFrame, panel: str, title: str, **encoding) -> alt.FacetChart:
    """Lines with ``encoding``, one panel per value of the column ``panel``, each with its own y scale."""
    base = _chart(frame, None).mark_line().encode(**encoding)
    return (
        base.facet(column=alt.Column(f"{panel}:N", title=None)).resolve_scale(y="independent").properties(title=title)
    )


def _chart(frame: pd.DataFrame, title: str | None) -> alt.Chart:
    chart = alt.Chart(_data(frame)).properties(width=WIDTH, height=HEIGHT)
    return chart.properties(title=title) if title else chart


def _require(frame: pd.DataFrame, name: str, columns: tuple[str, ...]) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{name} needs columns {list(columns)}; the frame lacks {missing}")
    if frame.empty:
        raise ValueError(f"{name} got an empty frame; the report shows a 'not available' note instead")
