"""The report: warehouse queries, the paper's tables beside ours, figures, and one offline HTML file.

:func:`load` runs :data:`QUERIES` on a DuckDB connection (open it ``read_only=True``) into
DataFrames; :func:`build` turns them into tables (the paper's Tables 1-8, with the paper's
values beside ours, plus the topological-vs-spectral and shuffled-null comparisons) and
:mod:`topometrics.charts` figures; :func:`render_html` writes nothing but returns the HTML text,
with the Vega/Vega-Lite/Vega-Embed bundle passed in (``vl_convert.javascript_bundle()``), so
the file opens with no network. A piece that cannot be shown (no features yet, empty analysis
tables, a skipped series) becomes :class:`Missing` with its reason, never an exception.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
from dataclasses import dataclass, field

import altair as alt
import duckdb
import numpy as np
import pandas as pd
import vl_convert as vlc

from topometrics import charts
from topometrics.vocabulary import names

# Vega-Lite version of altair's specs ("6.4"): vl-convert must render them with the same one.
VL_VERSION = ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])

# --- the paper's numbers ("Topological Persistence of Transformer Weight Spaces", seed paper) -------

# Table 1: configurations, parameter counts and final WikiText-2 validation loss.
PAPER_TABLE1 = pd.DataFrame(
    [
        ("tiny", 2936, 2.466),
        ("small", 7408, 2.099),
        ("medium", 20640, 1.853),
        ("large", 46368, 1.653),
        ("xl", 97200, 1.468),
    ],
    columns=["rung", "paper n_params", "paper final loss"],
)
# Table 2: Spearman rho(VR H0 total persistence, loss) with p and 95% bootstrap CI.
PAPER_TABLE2 = pd.DataFrame(
    [
        ("tiny", -0.590, 5.2e-6, -0.796, -0.350),
        ("small", -0.854, 1.7e-15, -0.938, -0.710),
        ("medium", -0.866, 2.3e-16, -0.946, -0.713),
        ("large", -0.900, 3.0e-19, -0.966, -0.769),
        ("xl", -0.907, 4.7e-20, -0.970, -0.790),
    ],
    columns=["rung", "paper rho", "paper p", "paper ci_low", "paper ci_high"],
)
# Table 3: Spearman rho(mean neural persistence, loss).
PAPER_TABLE3 = pd.DataFrame(
    [
        ("tiny", -0.312, 0.026),
        ("small", 0.031, 0.829),
        ("medium", 0.659, 1.5e-7),
        ("large", 0.615, 1.6e-6),
        ("xl", 0.530, 6.4e-5),
    ],
    columns=["rung", "paper rho", "paper p"],
)
# Table 4: Spearman rho(VR H1 total persistence, loss).
PAPER_TABLE4 = pd.DataFrame(
    [
        ("tiny", -0.641, 4.1e-7),
        ("small", -0.636, 5.2e-7),
        ("medium", -0.580, 8.0e-6),
        ("large", -0.492, 2.5e-4),
        ("xl", 0.053, 0.714),
    ],
    columns=["rung", "paper rho", "paper p"],
)
# Table 5: final-loss prediction MAE per fraction; the paper's three methods mapped onto ours.
PAPER_TABLE5 = pd.DataFrame(
    [
        (0.2, "loss_power_law", 0.1064, None), (0.2, "topology", 0.2634, None), (0.2, "loss_topology", 0.1486, -39.7),
        (0.3, "loss_power_law", 0.1011, None), (0.3, "topology", 0.1499, None), (0.3, "loss_topology", 0.0903, 10.6),
        (0.5, "loss_power_law", 0.0860, None), (0.5, "topology", 0.0554, None), (0.5, "loss_topology", 0.0610, 29.0),
    ],
    columns=["fraction", "method", "paper mae", "paper improvement %"],
)  # fmt: skip
# Table 6: step of max |dNP| and the diminishing-returns step (10% of the peak), of 5,000 steps.
PAPER_TABLE6 = pd.DataFrame(
    [("tiny", 300, 800), ("small", 300, 400), ("medium", 300, 1800), ("large", 200, 1500), ("xl", 300, 1600)],
    columns=["rung", "paper peak_step", "paper diminishing_step"],
)
# Table 7: power laws f(N) = a N^b + c of final-checkpoint values.
PAPER_TABLE7 = pd.DataFrame(
    [
        ("val_loss", -0.144, 0.997, -1.00, "< 1e-24"),
        ("vr_tp0", 0.204, 0.852, 0.90, 0.037),
        ("np_norm", -0.024, 0.266, -0.30, 0.624),
    ],
    columns=["target", "paper exponent", "paper r2", "paper rho", "paper p"],
)
# Table 8: Pythia-14m across training (NP mean/std over layers, H0 total persistence).
PAPER_TABLE8 = pd.DataFrame(
    [
        (0, 0.338, 0.029, 69.7), (1000, 0.377, 0.067, 69.4), (5000, 0.484, 0.132, 70.9), (10000, 0.531, 0.147, 69.8),
        (50000, 0.611, 0.146, 54.4), (100000, 0.627, 0.140, 46.1), (143000, 0.636, 0.132, 45.4),
    ],
    columns=["step", "paper NP mean", "paper NP std", "paper H0 total"],
)  # fmt: skip

# Layer-'all' features the report shows (names declared in topometrics.vocabulary).
H0_TOTAL, H1_TOTAL = names("vr_tp0", "vr_tp1")
NP_FEATURES = names("np_norm", "np_sum")
TOPO_HEADLINE = names("vr_tp0", "vr_tp1", "np_norm", "np_sum", "rep_tp0", "rep_tp1")
SCALING_FEATURES = ("val_loss", *names("vr_tp0", "vr_tp1", "np_norm", "np_sum", "rep_tp0"))
NP_SHUFFLED, NP_STD, REP_W1_PREV = names("np_shuffled_norm", "np_norm_std", "rep_w1_prev")
BETTI = re.compile(r"^rep_betti(\d)_(\d+)$")  # the per-scale names of rep_betti0 / rep_betti1

QUERIES = {
    "runs": "SELECT * FROM runs ORDER BY kind, rung, seed",
    "meta": "SELECT key, value FROM meta",
    "rungs": "SELECT * FROM rungs",
    "checkpoints": "SELECT c.rung, c.seed, c.step, c.val_loss, g.kind FROM checkpoints c JOIN rungs g USING (rung)",
    "final": "SELECT rung, seed, step, val_loss, n_params, kind, complete FROM final_checkpoints",
    "features": """SELECT f.rung, f.seed, f.step, f.feature, f.value, g.kind FROM features f JOIN rungs g USING (rung)
                   WHERE f.layer = 'all' AND f.value IS NOT NULL AND NOT isnan(f.value)""",
    "np": "SELECT n.rung, n.seed, n.step, n.np, g.kind FROM np_series n JOIN rungs g USING (rung)",
    "rho": """SELECT s.rung, s.seed, s.feature, s.n, s.rho, g.kind FROM feature_loss_spearman s
              JOIN rungs g USING (rung) WHERE s.layer = 'all'""",
    "spearman": "SELECT * FROM tests WHERE kind = 'spearman' AND layer = 'all'",
    "topo_vs_spectral": "SELECT * FROM tests WHERE kind = 'topo_vs_spectral'",
    "mae": "SELECT * FROM prediction_mae",
    "phases": "SELECT * FROM phases",
    "early_stopping": "SELECT * FROM early_stopping",
    "scaling": "SELECT * FROM scaling WHERE kind = 'ladder' AND layer IN ('all', 'checkpoint')",
    "scaling_fits": "SELECT * FROM fits WHERE kind = 'scaling'",
}


@dataclass(frozen=True)
class Missing:
    """A table or figure that cannot be shown, and why."""

    reason: str


@dataclass
class Report:
    """Everything the HTML shows; the stage also saves ``figures`` and ``plots`` as files."""

    banner: dict[str, str]
    corpus_used: str | None
    corpus_fallback: bool
    tables: dict[str, pd.DataFrame | Missing] = field(default_factory=dict)  # title -> table
    figures: dict[str, alt.TopLevelMixin | Missing] = field(default_factory=dict)  # file stem -> chart
    plots: dict[str, pd.DataFrame] = field(default_factory=dict)  # DVC plot file stem -> long frame


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


# --- the whole report ------------------------------------------------------------------------------


def build(frames: dict[str, pd.DataFrame | Missing], series_status: dict | None = None) -> Report:
    """Tables, figures and DVC plot frames from :func:`load`'s frames and the series stage's status."""
    f = {k: _need(v, k) for k, v in frames.items()}
    report = Report(*banner(f["runs"], f["meta"], series_status))
    report.tables = {
        "Table 1 — model configurations and final loss": table1(f["rungs"], f["final"]),
        "Table 2 — ρ(VR H0 total persistence, loss)": rho_table(f["spearman"], f["rho"], (H0_TOTAL,), PAPER_TABLE2),
        "Table 3 — ρ(neural persistence, loss)": rho_table(f["spearman"], f["rho"], NP_FEATURES, PAPER_TABLE3),
        "Table 4 — ρ(VR H1 total persistence, loss)": rho_table(f["spearman"], f["rho"], (H1_TOTAL,), PAPER_TABLE4),
        "Table 5 — final-loss prediction MAE": table5(f["mae"]),
        "Table 6 — phases of neural persistence": table6(f["phases"]),
        "Early stopping — NP patience vs validation-loss patience": _ordered(f["early_stopping"]),
        "Table 7 — power-law scaling with model size": table7(f["scaling_fits"]),
        "Table 8 — checkpoint-series validation": table8(f["np"], f["features"], series_status),
        "Topological vs spectral — Δ|ρ| (Steiger z; * Bonferroni-significant)": topo_vs_spectral(f["topo_vs_spectral"]),
        "Shuffled null — ρ(NP, loss) vs ρ(NP of shuffled weights, loss)": shuffled_null(f["spearman"], f["rho"]),
    }
    report.figures = figures(f)
    report.plots = dvc_plots(f["checkpoints"], f["np"])
    return report


def banner(runs, meta, series_status: dict | None) -> tuple[dict[str, str], str | None, bool]:
    """Banner lines (corpus, series status, params digest, code version), the corpus used, and the fallback flag."""
    out, used, fallback = {}, None, False
    ladder = _ladder(runs) if isinstance(runs, pd.DataFrame) else pd.DataFrame()
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
    values = dict(zip(meta["key"], meta["value"], strict=True)) if isinstance(meta, pd.DataFrame) else {}
    out["params digest"] = params_digest(values, ladder)
    out["code version"] = values.get("code_version", "not recorded")
    out["warehouse schema"] = values.get("schema_version", "not recorded")
    return out, used, fallback


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


def params_digest(meta: dict[str, str], ladder: pd.DataFrame) -> str:
    """The params digest recorded in the warehouse, else a hash of the runs' config fingerprints."""
    for key in ("params_digest", "params_sha256"):
        if meta.get(key):
            return meta[key]
    if meta.get("params"):
        return hashlib.sha256(meta["params"].encode()).hexdigest()[:16] + " (sha256 of meta.params)"
    if not ladder.empty and ladder["fingerprint"].notna().any():
        text = "\n".join(sorted(ladder["fingerprint"].dropna().astype(str)))
        return hashlib.sha256(text.encode()).hexdigest()[:16] + " (sha256 of the runs' config fingerprints)"
    return "not recorded"


# --- tables ----------------------------------------------------------------------------------------


def table1(rungs, final) -> pd.DataFrame | Missing:
    """Shape, parameter count and final validation loss (mean over seeds) per rung, beside Table 1."""
    if isinstance(rungs, Missing) or isinstance(final, Missing):
        return rungs if isinstance(rungs, Missing) else final
    loss = final.groupby("rung").agg(final_val_loss=("val_loss", "mean"), seeds=("seed", "nunique"))
    loss = loss.join(final.groupby("rung")["step"].max().rename("final_step"))
    cols = ["rung", "kind", "n_params", "hidden", "layers", "heads"]
    out = rungs[cols].merge(loss.reset_index(), on="rung", how="left").merge(PAPER_TABLE1, on="rung", how="left")
    order = ["rung", "kind", "n_params", "paper n_params", "hidden", "layers", "heads", "seeds", "final_step"]
    return _ordered(out[[*order, "final_val_loss", "paper final loss"]])


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
    return _ordered(ours.merge(paper, on="rung", how="left"), extra=["feature"])


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
    return _ordered(out)


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
    wide = _wide(features[features["kind"] == "series"], [NP_STD, H0_TOTAL])
    wide = wide.rename(columns={NP_STD: "NP std", H0_TOTAL: "H0 total"})
    out = ours_np.merge(wide, on=["rung", "step"], how="left").merge(PAPER_TABLE8, on="step", how="outer")
    cols = ["rung", "step", "NP mean", "paper NP mean", "NP std", "paper NP std", "H0 total", "paper H0 total"]
    return out.reindex(columns=cols).sort_values("step").reset_index(drop=True)


def topo_vs_spectral(tests) -> pd.DataFrame | Missing:
    """|rho(topological, loss)| - |rho(spectral, loss)| per headline topological x spectral feature x rung."""
    if isinstance(tests, Missing):
        return tests
    mine = tests[tests["feature"].isin(TOPO_HEADLINE) & tests["estimate"].notna()]
    if mine.empty:
        return Missing("no topological-vs-spectral tests for the headline features")
    stars = mine["significant"].fillna(False).map({True: "*", False: ""})
    column = mine["rung"] + (":" + mine["seed"].astype(str) if mine["seed"].nunique() > 1 else "")
    cell = mine.assign(cell=mine["estimate"].map("{:+.3f}".format) + stars, column=column)
    wide = cell.pivot_table(index=["feature", "other"], columns="column", values="cell", aggfunc="first")
    order = [c for r in charts.rung_domain(mine["rung"]) for c in wide.columns if c.split(":")[0] == r]
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
    return _ordered(out.assign(abs_gap=out["rho"].abs() - out["rho_shuffled"].abs()))


# --- figures ---------------------------------------------------------------------------------------


def figures(f: dict[str, pd.DataFrame | Missing]) -> dict[str, alt.TopLevelMixin | Missing]:
    """Every figure of the report by file stem; a figure without data is :class:`Missing`."""
    ladder = {k: _ladder(v) if isinstance(v, pd.DataFrame) and "kind" in v else v for k, v in f.items()}
    feats = ladder["features"]
    out = {
        "loss_curves": _chart(charts.loss_curves, ladder["checkpoints"], "no checkpoints"),
        "np_evolution": _chart(charts.np_evolution, ladder["np"], "no neural persistence features"),
        "vr_evolution": _chart(charts.vr_evolution, _select(feats, (H0_TOTAL, H1_TOTAL)), "no vr_tp0/vr_tp1 features"),
        "tp0_vs_loss": _chart(charts.tp0_vs_loss, _tp0_loss(feats, ladder["checkpoints"]), "no vr_tp0 features"),
        "correlation_heatmap": _chart(charts.correlation_heatmap, _heatmap(f["rho"]), "no correlations"),
        "prediction_comparison": _chart(charts.prediction_comparison, _mae(f["mae"]), "no predictions"),
        "scaling": _scaling(f["scaling"], f["scaling_fits"]),
        "betti_curves": _chart(charts.betti_curves, _betti(feats), "no rep_betti* features"),
        "wasserstein_to_previous": _chart(
            charts.wasserstein_to_previous, _select(feats, (REP_W1_PREV,)), "no rep_w1_prev features"
        ),
        "validation_series": _chart(charts.validation_series, _series(f["np"], f["features"]), "no external series"),
    }
    return out


def dvc_plots(checkpoints, np_series) -> dict[str, pd.DataFrame]:
    """Long frames for ``dvc plots``: ``loss`` (step, rung, val_loss) and ``np`` (step, rung, np), ladder only."""
    out = {}
    for name, frame, value in (("loss", checkpoints, "val_loss"), ("np", np_series, "np")):
        if isinstance(frame, pd.DataFrame) and not frame.empty:
            long = _ladder(frame).groupby(["step", "rung"], as_index=False)[value].mean()
            out[name] = long.sort_values(["rung", "step"], key=_rung_key).reset_index(drop=True)
        else:
            out[name] = pd.DataFrame(columns=["step", "rung", value])
    return out


# --- HTML ------------------------------------------------------------------------------------------


def render_html(report: Report, vega_bundle: str) -> str:
    """One self-contained HTML page: banner, figures, tables; ``vega_bundle`` is inlined, nothing is fetched."""
    if "</script" in vega_bundle.lower():
        raise ValueError(
            "the Vega bundle contains '</script' and cannot be inlined; use vl_convert.javascript_bundle()"
        )
    toc = "".join(f'<li><a href="#fig-{n}">Figure: {n.replace("_", " ")}</a></li>' for n in report.figures)
    toc += "".join(f'<li><a href="#{_slug(t)}">{html.escape(t)}</a></li>' for t in report.tables)
    body = [_banner_html(report), f'<nav><ol class="toc">{toc}</ol></nav>', "<h2>Figures</h2>"]
    body += ['<div class="figures">', *(_figure_html(n, c) for n, c in report.figures.items()), "</div>"]
    body.append("<h2>Tables (ours beside the paper's)</h2>")
    body += [_table_html(title, table) for title, table in report.tables.items()]
    return _PAGE.format(style=_STYLE, bundle=vega_bundle, body="\n".join(body), embed=_EMBED)


def export_figure(chart: alt.TopLevelMixin, scale: float = 2.0) -> tuple[str, bytes]:
    """The chart as SVG text and PNG bytes, rendered by vl-convert (no browser, no network)."""
    spec = chart.to_dict()
    return vlc.vegalite_to_svg(spec, vl_version=VL_VERSION), vlc.vegalite_to_png(
        spec, vl_version=VL_VERSION, scale=scale
    )


def vega_bundle() -> str:
    """Vega, Vega-Lite (the version altair writes) and Vega-Embed as one script to inline."""
    return vlc.javascript_bundle(vl_version=VL_VERSION)


def spec_json(chart: alt.TopLevelMixin) -> str:
    """The chart's Vega-Lite spec as JSON that is safe inside a ``<script>`` element."""
    return json.dumps(chart.to_dict(), sort_keys=True).replace("<", "\\u003c")


def _banner_html(report: Report) -> str:
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in report.banner.items())
    kind = "banner fallback" if report.corpus_fallback else "banner"
    return f'<h1>topometrics report</h1><table class="{kind}">{rows}</table>'


def _table_html(title: str, table: pd.DataFrame | Missing) -> str:
    head = f'<h3 id="{_slug(title)}">{html.escape(title)}</h3>'
    if isinstance(table, Missing):
        return head + f'<p class="missing">not available: {html.escape(table.reason)}</p>'
    shown = table.apply(lambda col: col.map(_fmt))
    return head + shown.to_html(index=False, escape=True, na_rep="—", classes="data", border=0)


def _figure_html(name: str, chart) -> str:
    head = f'<section class="figure"><h3 id="fig-{name}">Figure: {html.escape(name.replace("_", " "))}</h3>'
    if isinstance(chart, Missing):
        return head + f'<p class="missing">not available: {html.escape(chart.reason)}</p></section>'
    div = f'<div class="chart" id="chart-{name}"></div>'
    return head + div + f'<script type="application/json" data-chart="{name}">{spec_json(chart)}</script></section>'


def _fmt(value):
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return "—"
    if isinstance(value, float | np.floating):
        if float(value).is_integer() and abs(value) < 1e7:
            return f"{int(value)}"
        return f"{value:.2e}" if abs(value) < 1e-3 else f"{value:.4g}"
    return value


def _slug(title: str) -> str:
    return "t-" + re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:40]


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1600px; }
table.banner { border: 2px solid #4c78a8; background: #eef4fb; margin-bottom: 1em; }
table.banner.fallback { border: 4px solid #c00; background: #ffecec; font-weight: bold; }
table.banner th { text-align: left; padding: 4px 12px; }
table.data { border-collapse: collapse; font-size: 13px; margin-bottom: 1.5em; }
table.data th, table.data td { border-bottom: 1px solid #ddd; padding: 3px 8px; text-align: right; }
table.data th { background: #f3f3f3; }
p.missing { color: #a40; font-style: italic; }
div.figures { display: flex; flex-wrap: wrap; gap: 1em 3em; }
div.chart { margin-bottom: 1em; }
ol.toc { columns: 2; font-size: 14px; }
"""
_EMBED = """
document.querySelectorAll("script[data-chart]").forEach(function (node) {
  var target = "#chart-" + node.dataset.chart;
  vegaEmbed(target, JSON.parse(node.textContent), {renderer: "svg", actions: false}).catch(function (err) {
    document.querySelector(target).textContent = "chart failed to render: " + err;
    console.error(err);
  });
});
"""
_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>topometrics report</title>
<style>{style}</style>
<script type="text/javascript">{bundle}</script>
</head><body>
{body}
<script type="text/javascript">{embed}</script>
</body></html>
"""


# --- helpers ---------------------------------------------------------------------------------------


def _need(frame, name: str):
    """An empty table becomes :class:`Missing` with the stage that fills it."""
    if isinstance(frame, pd.DataFrame) and frame.empty:
        return Missing(f"`{name}` is empty ({_FILLED_BY.get(name, 'an earlier stage has not run')})")
    return frame


_FILLED_BY = {
    "features": "the features stage has not run",
    "np": "no neural-persistence features yet",
    "rho": "no features yet",
    "spearman": "the analysis stage has not filled `tests`",
    "topo_vs_spectral": "no spectral features, or the analysis stage has not run",
    "mae": "the analysis stage has not filled `predictions`",
    "scaling_fits": "the analysis stage has not filled `fits`",
    "phases": "no neural-persistence features yet",
}


def _chart(function, frame, what: str):
    if isinstance(frame, Missing):
        return frame
    if frame is None or frame.empty:
        return Missing(what)
    return function(frame)


def _ladder(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["kind"] == "ladder"] if "kind" in frame else frame


def _rung_key(col: pd.Series) -> pd.Series:
    if col.name != "rung":
        return col
    domain = charts.rung_domain(col)
    return col.map({r: i for i, r in enumerate(domain)})


def _ordered(frame, extra: list[str] | None = None):
    if isinstance(frame, Missing) or "rung" not in frame:
        return frame
    keys = ["rung"] + [c for c in ("seed", *(extra or [])) if c in frame]
    return frame.sort_values(keys, key=_rung_key).reset_index(drop=True)


def _select(features, names: tuple[str, ...]):
    if isinstance(features, Missing):
        return features
    return features[features["feature"].isin(names)]


def _wide(features: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    mine = features[features["feature"].isin(names)]
    wide = mine.pivot_table(index=["rung", "step"], columns="feature", values="value", aggfunc="mean")
    return wide.reindex(columns=names).reset_index()


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
    mine = rho[~rho["feature"].str.match(BETTI.pattern) & rho["rho"].notna()]
    return mine.groupby(["rung", "feature"], as_index=False)["rho"].mean()


def _mae(mae):
    if isinstance(mae, Missing):
        return mae
    mine = mae[mae["mae"].notna()]
    label = np.where(mine["cv"].isin(["none", "rung"]), mine["method"], mine["method"] + " (cv " + mine["cv"] + ")")
    return mine.assign(method=label)[["method", "fraction", "mae"]]


def _scaling(points, fits):
    if isinstance(points, Missing):
        return points
    mine = points[points["feature"].isin(SCALING_FEATURES) & (points["value"] > 0)]
    if mine.empty:
        return Missing("no positive final-checkpoint values for the scaling features")
    mine = mine.groupby(["rung", "n_params", "feature"], as_index=False)["value"].mean()
    return charts.scaling(mine, _fitted_curves(fits, mine))


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
    mine = features.assign(dim="H" + parsed[0], scale=pd.to_numeric(parsed[1])).dropna(subset=["scale"])
    if mine.empty:
        return mine
    seed = mine.groupby("rung")["seed"].transform("min")
    mine = mine[mine["seed"] == seed]
    first, last = (mine.groupby("rung")["step"].transform(fn) for fn in ("min", "max"))
    mine = mine[(mine["step"] == first) | (mine["step"] == last)]
    label = np.where(mine["step"] == last.loc[mine.index], "final", "first")
    return mine.assign(checkpoint=label, betti=mine["value"])[["rung", "checkpoint", "dim", "scale", "betti"]]


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
