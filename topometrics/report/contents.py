"""The report: the paper's tables beside ours, and the whole report's contents.

:func:`build` turns the warehouse frames (``topometrics.report.frames.load``) into tables (the
paper's Tables 1-8, with the paper's values beside ours, plus the topological-vs-spectral and
shuffled-null comparisons), figures (``topometrics.report.figures``) and DVC plot frames;
``topometrics.report.html`` renders them. A piece that cannot be shown (no features yet, empty
analysis tables, a skipped series) is :class:`~topometrics.report.frames.Missing` with its reason.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import altair as alt
import pandas as pd

from topometrics.analysis.predict import prediction_summary
from topometrics.report import charts, decision
from topometrics.report.answer import Answer, answer
from topometrics.report.figures import dvc_plots, figures
from topometrics.report.frames import BETTI, Missing, ladder_only, need, ordered, wide_features
from topometrics.report.paper import (
    PAPER_TABLE1,
    PAPER_TABLE2,
    PAPER_TABLE3,
    PAPER_TABLE4,
    PAPER_TABLE5,
    PAPER_TABLE6,
    PAPER_TABLE7,
    PAPER_TABLE8,
)
from topometrics.report.verdict import loss_unit, section
from topometrics.vocabulary import names

# Layer-'all' features the tables show (names declared in topometrics.vocabulary).
H0_TOTAL, H1_TOTAL = names("vr_tp0", "vr_tp1")
NP_FEATURES = names("np_norm", "np_sum")
TOPO_HEADLINE = names("vr_tp0", "vr_tp1", "np_norm", "np_sum", "rep_tp0", "rep_tp1")
NP_SHUFFLED, NP_STD = names("np_shuffled_norm", "np_norm_std")


@dataclass
class Report:
    """Everything the HTML shows; the stage also saves ``figures`` and ``plots`` as files."""

    banner: dict[str, str]
    corpus_used: str | None
    corpus_fallback: bool
    tables: dict[str, pd.DataFrame | Missing] = field(default_factory=dict)  # title -> table
    figures: dict[str, alt.TopLevelMixin | Missing] = field(default_factory=dict)  # file stem -> chart
    plots: dict[str, pd.DataFrame] = field(default_factory=dict)  # DVC plot file stem -> long frame
    # The opening: the verdict in a few sentences, or why there is none and the command that gives one.
    answer: Answer = field(default_factory=lambda: Answer(("not built",)))
    # "What topology adds": the verdict table (with a 'reads as' sentence per row) and its figures.
    verdict: pd.DataFrame | Missing = field(default_factory=lambda: Missing("not built"))
    verdict_figures: dict[str, alt.TopLevelMixin | Missing] = field(default_factory=dict)


# --- the whole report ------------------------------------------------------------------------------


def build(frames: dict[str, pd.DataFrame | Missing], series_status: dict | None = None) -> Report:
    """Tables, figures and DVC plot frames from :func:`load`'s frames and the series stage's status."""
    available = {k: need(v, k) for k, v in frames.items()}
    report = Report(
        *banner(available["runs"], available["meta"], series_status, available["rho"], available.get("predictions"))
    )
    report.answer = answer(available["verdict"], available["meta"], available["runs"])
    report.verdict, report.verdict_figures = section(available)
    report.verdict_figures["stopping_curve"] = decision.stopping_curve(available["stopping"])
    report.tables = {
        "Stopping decisions — compute saved and regret when the worst runs stop early": available["stopping"],
        "Prediction intervals — measured coverage beside the nominal 80 % and 95 %": decision.coverage_table(
            available["coverage"]
        ),
        "Table 1 — model configurations and final loss": table1(available["rungs"], available["final"]),
        "Table 2 — ρ(VR H0 total persistence, loss)": rho_table(
            available["spearman"], available["rho"], (H0_TOTAL,), PAPER_TABLE2
        ),
        "Table 3 — ρ(neural persistence, loss)": rho_table(
            available["spearman"], available["rho"], NP_FEATURES, PAPER_TABLE3
        ),
        "Table 4 — ρ(VR H1 total persistence, loss)": rho_table(
            available["spearman"], available["rho"], (H1_TOTAL,), PAPER_TABLE4
        ),
        "Table 5 — final-loss prediction MAE": table5(available["mae"]),
        "Table 6 — phases of neural persistence": table6(available["phases"]),
        "Changepoints (PELT) beside the threshold rule — first step, count, lag in checkpoints": ordered(
            available["changepoints"], ["series"]
        ),
        "Early stopping — NP patience vs validation-loss patience": ordered(available["early_stopping"]),
        "Table 7 — power-law scaling with model size": table7(available["scaling_fits"]),
        "Table 8 — checkpoint-series validation": table8(available["np"], available["features"], series_status),
        "Topological vs spectral — Δ|ρ| (Steiger z; * Bonferroni-significant)": topo_vs_spectral(
            available["topo_vs_spectral"]
        ),
        "Shuffled null — ρ(NP, loss) vs ρ(NP of shuffled weights, loss)": shuffled_null(
            available["spearman"], available["rho"]
        ),
    }
    report.figures = figures(available)
    report.plots = dvc_plots(available["checkpoints"], available["np"])
    return report


def banner(
    runs, meta, series_status: dict | None, rho=None, predictions=None
) -> tuple[dict[str, str], str | None, bool]:
    """Banner lines (corpus, series, runs, why predictions failed, params digest, code version), the corpus used and
    the fallback flag."""
    out, used, fallback = {}, None, False
    ladder = ladder_only(runs) if isinstance(runs, pd.DataFrame) else pd.DataFrame()
    if ladder.empty:
        out["corpus"] = "unknown: the warehouse has no ladder runs"
    else:
        first = ladder.iloc[0]
        used = first["corpus_used"]
        fallback = bool(ladder["corpus_fallback"].fillna(False).any())
        out["corpus"] = f"{first['corpus_used']} (requested {first['corpus_requested']})"
        if fallback:
            out["corpus"] = (
                f"OFFLINE FALLBACK CORPUS: {first['corpus_used']} was used instead of {first['corpus_requested']} "
                f"({first['corpus_reason']}). Losses are not comparable with the paper's WikiText-2 numbers."
            )
    out["validation series"] = series_line(runs, series_status)
    if isinstance(runs, pd.DataFrame) and (runs["kind"] == "series").any():
        out["series ρ against"] = series_loss_line(runs, rho)
    out["runs"] = runs_line(ladder)
    if isinstance(predictions, pd.DataFrame):  # why predictions failed, grouped by cause (a short run: checkpoints)
        out["predictions"] = prediction_summary(predictions)
    values = dict(zip(meta["key"], meta["value"], strict=True)) if isinstance(meta, pd.DataFrame) else {}
    out["params digest"] = params_digest(values)
    out["code version"] = values.get("code_version", "not recorded")
    out["warehouse schema"] = values.get("schema_version", "not recorded")
    return out, used, fallback


def runs_line(ladder: pd.DataFrame) -> str:
    """How the ladder runs ended: diverged runs (left out of fits and predictions) by name, with the reason."""
    if ladder.empty:
        return "no ladder runs"
    status = ladder["status"] if "status" in ladder else pd.Series(None, index=ladder.index)
    bad = ladder[status == "diverged"]
    text = f"{len(ladder)} runs, {int((status == 'complete').sum())} complete"
    if bad.empty:
        return text
    names = "; ".join(f"{r.rung}-{r.seed}: {r.status_reason}" for r in bad.itertuples(index=False))
    return f"{text}, {len(bad)} DIVERGED (left out of fits and predictions) — {names}"


def series_line(runs, status: dict | None) -> str:
    """Whether each validation series ran or was skipped and why (the series stage's status.json)."""
    names = sorted(runs.loc[runs["kind"] == "series", "rung"].unique()) if isinstance(runs, pd.DataFrame) else []
    if status is not None:
        return "; ".join(_series_status(s) for s in status.get("series", [])) or "no series configured"
    if names:
        return f"in the warehouse: {', '.join(names)} (no status file)"
    return "not run: no status file and no external series in the warehouse"


def _series_status(series: dict) -> str:
    """'<name>: ran (n computed, m skipped)' or '<name>: SKIPPED (...); why: <reasons>'."""
    done, skipped = series.get("computed", 0), series.get("skipped", 0)
    checkpoints = series.get("checkpoints", [])
    reasons = sorted({c["reason"] for c in checkpoints if c.get("status") == "skipped" and c.get("reason")})
    text = f"{series.get('name')}: {'ran' if done else 'SKIPPED'} ({done} checkpoints computed, {skipped} skipped)"
    return text + (f"; why: {' | '.join(reasons[:3])}" if reasons else "")


def series_loss_line(runs: pd.DataFrame, rho) -> str:
    """Which loss each external series' rho is taken against (``feature_loss_spearman.loss``), or why it has none."""
    found = rho[rho["kind"] == "series"] if isinstance(rho, pd.DataFrame) and "loss" in rho else pd.DataFrame()
    against = found.groupby("rung")["loss"].first().to_dict() if len(found) else {}
    words = {"val_loss": "the validation loss", "train_loss": "the training loss (no validation loss logged)"}
    lines = []
    for name in sorted(runs.loc[runs["kind"] == "series", "rung"].unique()):
        why = "none: no loss at its checkpoints (hub revisions carry none; a run folder needs a losses file)"
        lines.append(f"{name}: {words.get(against.get(name), why)}")
    return "; ".join(lines)


def params_digest(meta: dict[str, str]) -> str:
    """The sha256 (16 hex digits) of the params snapshot the warehouse recorded in ``meta.params``."""
    if meta.get("params"):
        return hashlib.sha256(meta["params"].encode()).hexdigest()[:16] + " (sha256 of meta.params)"
    return "not recorded"


# --- tables ----------------------------------------------------------------------------------------


def table1(rungs, final) -> pd.DataFrame | Missing:
    """Shape, parameter count and final validation loss (mean over seeds, in analysis.loss_unit, which the
    column names) per rung, beside Table 1."""
    if isinstance(rungs, Missing) or isinstance(final, Missing):
        return rungs if isinstance(rungs, Missing) else final
    loss = final.groupby("rung").agg(final_val_loss=("val_loss", "mean"), seeds=("seed", "nunique"))
    loss = loss.join(final.groupby("rung")["step"].max().rename("final_step"))
    cols = ["rung", "kind", "n_params", "hidden", "layers", "heads"]
    out = rungs[cols].merge(loss.reset_index(), on="rung", how="left").merge(PAPER_TABLE1, on="rung", how="left")
    order = ["rung", "kind", "n_params", "paper n_params", "hidden", "layers", "heads", "seeds", "final_step"]
    unit = UNIT_WORDS[loss_unit(final)]
    return ordered(
        out[[*order, "final_val_loss", "paper final loss"]].rename(columns={"final_val_loss": f"final loss ({unit})"})
    )


UNIT_WORDS = {"nats": "nats/token", "bpb": "bits/byte"}  # analysis.loss_unit as the report names it


def rho_table(spearman, rho, features: tuple[str, ...], paper: pd.DataFrame) -> pd.DataFrame | Missing:
    """Spearman rho of ``features`` (layer 'all') with loss per rung and seed, with p and bootstrap CI.

    From the analysis ``tests`` table; without it, from the ``feature_loss_spearman`` view (rho only).
    """
    if isinstance(spearman, pd.DataFrame) and spearman["feature"].isin(features).any():
        ours = spearman[spearman["feature"].isin(features)]
        ours = ours.rename(columns={"estimate": "rho", "p_value": "p"})
        ours = ours[["rung", "seed", "feature", "n", "rho", "p", "ci_low", "ci_high", "p_bonferroni", "reason"]]
    elif isinstance(rho, pd.DataFrame) and rho["feature"].isin(features).any():
        ours = rho.loc[rho["feature"].isin(features), ["rung", "seed", "feature", "n", "rho"]]
        ours = ours.assign(note="p and CI not available: the analysis tables are empty")
    else:
        return Missing(f"no {' / '.join(features)} correlations in the warehouse (features or analysis not run)")
    return ordered(ours.merge(paper, on="rung", how="left"), extra=["feature"])


def table5(mae) -> pd.DataFrame | Missing:
    """MAE per method x cv x fraction and the improvement over the loss-only power law, beside Table 5."""
    if isinstance(mae, Missing):
        return mae
    out = mae.merge(PAPER_TABLE5, on=["fraction", "method"], how="left")
    cols = ["fraction", "method", "cv", "n", "n_failed", "mae", "paper mae", "improvement_pct", "paper improvement %"]
    return out[cols].sort_values(["fraction", "cv", "mae"]).reset_index(drop=True)


def table6(phases) -> pd.DataFrame | Missing:
    """Peak |dNP| step and diminishing-returns step per rung, beside Table 6."""
    if isinstance(phases, Missing):
        return phases
    cols = ["rung", "seed", "np_source", "total_steps", "peak_step", "peak_fraction"]
    out = phases[[*cols, "diminishing_step", "diminishing_fraction"]].merge(PAPER_TABLE6, on="rung", how="left")
    return ordered(out)


def table7(fits) -> pd.DataFrame | Missing:
    """Power-law fits f(N) = a N^b + c across the ladder (exponent b, R^2, Spearman), beside Table 7."""
    if isinstance(fits, Missing):
        return fits
    fits = fits[~fits["target"].str.match(BETTI.pattern)]
    cols = ["target", "layer", "b", "paper exponent", "a", "c", "r2", "paper r2", "spearman_rho", "paper rho"]
    out = fits.merge(PAPER_TABLE7, on="target", how="left")[[*cols, "spearman_p", "paper p", "n", "status", "reason"]]
    first = out["paper exponent"].isna()  # the paper's three rows first, then ours alone
    return out.assign(_k=first).sort_values(["_k", "target"]).drop(columns="_k").rename(columns={"b": "exponent"})


def table8(np_series, features, status: dict | None) -> pd.DataFrame | Missing:
    """The external series (kind 'series') per step: NP mean and std over layers, H0 total, beside Table 8."""
    if isinstance(np_series, Missing) or isinstance(features, Missing):
        return np_series if isinstance(np_series, Missing) else features
    ours_np = np_series[np_series["kind"] == "series"][["rung", "step", "np"]].rename(columns={"np": "NP mean"})
    if ours_np.empty:
        return Missing(f"no external series in the warehouse; series stage: {series_line(None, status)}")
    wide = wide_features(features[features["kind"] == "series"], [NP_STD, H0_TOTAL])
    wide = wide.rename(columns={NP_STD: "NP std", H0_TOTAL: "H0 total"})
    out = ours_np.merge(wide, on=["rung", "step"], how="left").merge(PAPER_TABLE8, on="step", how="outer")
    cols = ["rung", "step", "NP mean", "paper NP mean", "NP std", "paper NP std", "H0 total", "paper H0 total"]
    return out.reindex(columns=cols).sort_values("step").reset_index(drop=True)


def topo_vs_spectral(tests) -> pd.DataFrame | Missing:
    """|rho(topological, loss)| - |rho(spectral, loss)| per headline topological x spectral feature x rung."""
    if isinstance(tests, Missing):
        return tests
    headline = tests[tests["feature"].isin(TOPO_HEADLINE) & tests["estimate"].notna()]
    if headline.empty:
        return Missing("no topological-vs-spectral tests for the headline features")
    stars = headline["significant"].fillna(False).map({True: "*", False: ""})
    column = headline["rung"] + (":" + headline["seed"].astype(str) if headline["seed"].nunique() > 1 else "")
    cell = headline.assign(cell=headline["estimate"].map("{:+.3f}".format) + stars, column=column)
    wide = cell.pivot_table(index=["feature", "other"], columns="column", values="cell", aggfunc="first")
    order = [c for r in charts.rung_domain(headline["rung"]) for c in wide.columns if c.split(":")[0] == r]
    wide = wide[order].rename_axis(columns=None)
    return wide.reset_index().rename(columns={"feature": "topological", "other": "spectral"})


def shuffled_null(spearman, rho) -> pd.DataFrame | Missing:
    """rho(NP, loss) beside rho(NP of the same layers with shuffled weights, loss): the null the paper lacks."""
    source = spearman if isinstance(spearman, pd.DataFrame) and not spearman.empty else rho
    if isinstance(source, Missing):
        return source
    source = source.rename(columns={"estimate": "rho"})
    real = source[source["feature"] == NP_FEATURES[0]][["rung", "seed", "rho"]]
    null = source[source["feature"] == NP_SHUFFLED][["rung", "seed", "rho"]]
    if real.empty or null.empty:
        return Missing("np_norm or np_shuffled_norm has no correlations in the warehouse")
    out = real.merge(null, on=["rung", "seed"], suffixes=("", "_shuffled"))
    return ordered(out.assign(abs_gap=out["rho"].abs() - out["rho_shuffled"].abs()))
