"""The report's lead section, "What topology adds": the verdict in words, a forest plot, a partial-rho heatmap.

From the warehouse views ``topology_verdict`` (what each family of inputs adds to the prediction of
a run's final loss, per cross-validation scheme x training fraction) and ``partial_spearman``
(within-run rho of each feature with the loss, training progress partialled out). A view that is
missing or empty, or has nothing to draw, is :class:`~topometrics.report.frames.Missing` with its reason.
"""

from __future__ import annotations

import math

import altair as alt
import pandas as pd

from topometrics.report.frames import Missing

# What the smaller model of each comparison already has, and what the larger one adds.
BASELINE = {
    "loss": "the loss curve", "norm": "the loss curve + weight norm", "recipe": "the loss curve + weight norm + recipe",
}  # fmt: skip
DEFAULT_BASELINE = "the loss curve + weight norm + recipe"
RULED_OUT = "for a linear use of these columns"  # what 'ruled out' can exclude: a nonlinear use may still help
ADDED = {"weight_norm": "the weight norm", "everything": "every family"}
FAMILY_WORDS = {"weights_vr": "weights-VR", "weights_np": "weights-NP", "scale_free": "scale-free"}
CV_WORDS = {"seed": "leave-one-seed-out", "variant": "leave-one-variant-out", "rung": "leave-one-rung-out"}
TABLE_COLUMNS = [
    "role", "cv", "fraction", "family", "baseline", "n", "n_cells", "mae_without", "delta_mae", "ci_low", "ci_high",
    "bound_share", "mae_without_sd", "decision_with", "decision_current", "n_outliers", "auroc_without", "auroc_with",
    "p_adjusted", "verdict",
]  # fmt: skip
ROLE_WORDS = {
    "primary": "pre-registered", "topology": "exploratory, Holm-corrected", "context": "context",
    "outlier": "exploratory, Holm-corrected over the outlier rows",
}  # fmt: skip


def _baseline(name) -> str:
    name = str(name) if isinstance(name, str) else "recipe"
    base, _, family = name.partition("+")
    words = BASELINE.get(base, DEFAULT_BASELINE)
    return f"{words} + {family}" if family else words


def _num(value, digits: int = 3) -> str:
    """A number as the sentences print it (``digits`` significant digits, a true minus sign); NaN as 'n/a'."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{float(value):.{digits}g}".replace("-", "\u2212")


def _percent(value) -> str:
    """A share in percent as the sentences print it: two significant digits, never an exponent (−107, not
    −1.1e+02); NaN as 'n/a'."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return _num(value, 2) if abs(value) < 100 else f"{value:.0f}".replace("-", "\u2212")


def _added(family: str) -> str:
    return ADDED.get(family, f"the {FAMILY_WORDS.get(family, family.replace('_', '-'))} family")


LOSS_UNITS = {"nats": "nats", "bpb": "bits per byte"}  # analysis.loss_unit as the sentences name it
# A change in MAE this small a share of the baseline MAE is float round-off (float64 carries ~16 digits; the fits'
# solvers lose a few), not a result: the sentence says "identical" rather than printing the noise as a number.
PRECISION = 1e-9


def identical(delta, mae_without) -> bool:
    """Whether ``delta`` (a change in MAE) is below numerical precision relative to the baseline's MAE."""
    scale = abs(mae_without) if mae_without is not None and not pd.isna(mae_without) else 1.0
    return abs(float(delta)) <= PRECISION * max(scale, 1e-12)


def loss_unit(final) -> str:
    """``analysis.loss_unit`` of the final-loss frame (its ``loss_unit`` column): 'bpb' or 'nats'."""
    has = isinstance(final, pd.DataFrame) and "loss_unit" in final and len(final)
    return "bpb" if has and (final["loss_unit"] == "bpb").any() else "nats"


def sentence(row, unit: str = "nats") -> str:
    """One quotable sentence for a ``topology_verdict`` row: the setting, the ΔMAE with its CI (in ``unit``,
    ``analysis.loss_unit``), n, p, the verdict."""
    when = f"At {_num(100 * row['fraction'])}% of training"
    cv = CV_WORDS.get(row["cv"], f"leave-one-{row['cv']}-out")
    what = f"adding {_added(row['family'])} to {_baseline(row.get('baseline'))}"
    role = ROLE_WORDS.get(row.get("role"), "exploratory")
    if row.get("role") == "outlier":
        return _outlier_sentence(row, when, cv, role)
    delta = row.get("delta_mae")
    if delta is None or pd.isna(delta):
        return f"{when}, {what} was not tested ({cv}, {role}): {row['verdict']}."
    if identical(delta, row.get("mae_without")):
        return (
            f"{when}, {what} leaves the predictions identical to the baseline's to numerical precision "
            f"(|ΔMAE| below {PRECISION:g} of its MAE; {cv}, {role}): "
            f"{row['verdict']}."
        )
    p = row.get("p_adjusted")
    kind = "Holm p" if row.get("role") == "topology" else "p"
    p_text = "no p-value" if p is None or pd.isna(p) else f"one-sided {kind}={_num(p, 2)}"
    bounds = f"[95% bounds {_num(row['ci_low'])}, {_num(row['ci_high'])}; cells as units]"
    numbers = f"{_num(delta)} {LOSS_UNITS.get(unit, unit)} {bounds}"
    share = f"{_percent(100 * row.get('gain_share', float('nan')))}% of the baseline MAE {_num(row.get('mae_without'))}"
    n = f"n={int(row['n'])} runs in {int(row.get('n_cells') or 0)} cells"
    word = f"{row['verdict']} {RULED_OUT}" if str(row["verdict"]).startswith("ruled out") else row["verdict"]
    level = {"within": "within cells, "}.get(row.get("level"), "")
    return f"{when}, {what} changes MAE by {numbers}, {share} ({n}, {level}{cv}, {role}, {p_text}): {word}."


def _outlier_sentence(row, when: str, cv: str, role: str) -> str:
    """The sentence of an outlier row: how well each model ranks the outlier runs above their cell-mates."""
    what = f"{_added(row['family'])} over {_baseline(row.get('baseline'))}"
    if row.get("status", "ok") != "ok" or pd.isna(row.get("auroc_with")):
        return f"{when}, {what} was not tested on the outlier runs ({cv}, {role}): {row['verdict']}."
    p = row.get("p_adjusted")
    p_text = "no p-value" if p is None or pd.isna(p) else f"one-sided Holm p={_num(p, 2)}"
    gain = row["auroc_with"] - row["auroc_without"]
    bounds = f"95% bounds {_num(row.get('auroc_low'))}, {_num(row.get('auroc_high'))}; cells as units"
    n = f"{int(row['n_outliers'])} outlier runs among n={int(row['n'])} in {int(row.get('n_cells') or 0)} cells"
    return (
        f"{when}, the within-cell AUROC of the predicted final loss for the outlier runs is "
        f"{_num(row['auroc_without'])} from {_baseline(row.get('baseline'))} and {_num(row['auroc_with'])} with "
        f"{_added(row['family'])} (gain {_num(gain)} [{bounds}]; {n}, {cv}, {role}, {p_text}): {row['verdict']}."
    )


def verdict_table(verdict, unit: str = "nats") -> pd.DataFrame | Missing:
    """The verdict rows (the primary endpoint first: role, cv, fraction, family, baseline, n, ΔMAE with its
    bounds, the largest gain allowed, the MAE in seed-SD units, pair decisions, p, verdict) with a 'reads as'
    sentence."""
    if isinstance(verdict, Missing):
        return verdict
    order = verdict.assign(_first=verdict.get("role", pd.Series("", index=verdict.index)) != "primary")
    rows = order.sort_values(["_first", "cv", "fraction", "family"]).drop(columns="_first").reset_index(drop=True)
    out = rows.reindex(columns=TABLE_COLUMNS)
    return out.assign(**{"reads as": [sentence(r, unit) for _, r in rows.iterrows()]})


def forest_plot(verdict) -> alt.TopLevelMixin | Missing:
    """ΔMAE (points) and its 95% CI (error bars) per family, a row per fraction, coloured by cv; a rule at 0."""
    if isinstance(verdict, Missing):
        return verdict
    tested = verdict[verdict["delta_mae"].notna() & verdict["ci_low"].notna() & verdict["ci_high"].notna()]
    if tested.empty:
        reasons = sorted(verdict["verdict"].dropna().unique())[:3]
        return Missing(f"no comparison produced a ΔMAE with a CI ({'; '.join(reasons) or 'no rows'})")
    data = tested[["cv", "fraction", "family", "n", "delta_mae", "ci_low", "ci_high", "p_adjusted", "verdict"]]
    family = alt.Y("family:N", title=None)
    tooltip = ["cv", "fraction", "family", "n", "delta_mae", "ci_low", "ci_high", "p_adjusted", "verdict"]
    bars = alt.Chart().mark_rule().encode(
        y=family, yOffset="cv:N", color="cv:N",
        x=alt.X("ci_low:Q", title="ΔMAE (with − without; < 0: the family helps)"), x2="ci_high:Q",
    )  # fmt: skip
    points = (
        alt.Chart()
        .mark_point(filled=True, size=50)
        .encode(y=family, yOffset="cv:N", color=alt.Color("cv:N", title="cv"), x="delta_mae:Q", tooltip=tooltip)
    )
    zero = alt.Chart().transform_calculate(zero="0").mark_rule(color="#888", strokeDash=[4, 3]).encode(x="zero:Q")
    layered = alt.layer(zero, bars, points, data=data).properties(width=360)
    return layered.facet(row=alt.Row("fraction:O", title="fraction of training")).properties(
        title="What each family adds: ΔMAE of the final-loss prediction, 95% bounds"
    )


def partial_rho_heatmap(partial) -> alt.TopLevelMixin | Missing:
    """Mean partial rho (over runs) of each feature with the loss, per control (weight norm, step)."""
    if isinstance(partial, Missing):
        return partial
    known = partial[partial["partial_rho"].notna()]
    if known.empty:
        return Missing("`partial_spearman` has no estimates (every test skipped)")
    mean = known.groupby(["feature", "control"], as_index=False).agg(
        partial_rho=("partial_rho", "mean"), runs=("partial_rho", "size")
    )
    base = alt.Chart(mean).encode(x=alt.X("control:N", title="controlled for"), y=alt.Y("feature:N", title=None))
    scale = alt.Scale(scheme="redblue", domain=[-1, 1])
    cells = base.mark_rect().encode(
        color=alt.Color("partial_rho:Q", scale=scale, title="mean partial ρ"),
        tooltip=["feature", "control", alt.Tooltip("partial_rho:Q", format=".3f"), "runs"],
    )
    labels = base.mark_text(fontSize=10).encode(text=alt.Text("partial_rho:Q", format=".2f"))
    return (cells + labels).properties(title="Partial ρ(feature, loss), training progress controlled, mean over runs")


def section(frames: dict) -> tuple[pd.DataFrame | Missing, dict[str, alt.TopLevelMixin | Missing]]:
    """The lead section's table and figures from the report frames (already passed through ``need``)."""
    verdict, partial = frames.get("verdict", Missing("no verdict frame")), frames.get("partial", Missing("none"))
    figures = {"topology_forest": forest_plot(verdict), "partial_rho": partial_rho_heatmap(partial)}
    return verdict_table(verdict, loss_unit(frames.get("final"))), figures
