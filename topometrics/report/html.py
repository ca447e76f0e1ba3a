"""The report as one offline HTML page, and its figures as SVG/PNG files (vl-convert: no browser, no network).

:func:`render_html` writes nothing but returns the HTML text, with the Vega/Vega-Lite/Vega-Embed
bundle passed in (:func:`vega_bundle`), so the file opens with no network; :func:`write_report`
writes the report stage's files.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import altair as alt
import duckdb
import numpy as np
import pandas as pd
import vl_convert as vlc

from topometrics.analysis.warehouse import connect_read_only, damaged
from topometrics.atomic import write_bytes, write_text
from topometrics.errors import TopometricsError
from topometrics.report.contents import Report, build
from topometrics.report.frames import Missing, load

# Vega-Lite version of altair's specs ("6.4"): vl-convert must render them with the same one.
VL_VERSION = ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])


def write_report(warehouse: Path, series_status: Path, out: Path) -> str:
    """The report stage: ``<out>/report.html``, ``figures/<name>.svg|png`` of every figure that can be drawn and
    ``plots/<name>.csv`` (DVC plots), from the warehouse (opened read-only) and the series stage's status file
    (absent: the banner says so). Returns a one-line summary."""
    status = read_series_status(series_status)
    with connect_read_only(warehouse) as con:
        try:
            doc = build(load(con), status)
        except duckdb.Error as err:  # a damaged block (a missing view is a Missing piece, not an error)
            raise damaged(warehouse, err) from err
    figures_dir, plots_dir = Path(out) / "figures", Path(out) / "plots"
    figures_dir.mkdir(parents=True, exist_ok=True)
    plots_dir.mkdir(parents=True, exist_ok=True)
    shown = {**doc.verdict_figures, **doc.figures}
    drawn = {name: chart for name, chart in shown.items() if not isinstance(chart, Missing)}
    for name, chart in drawn.items():
        svg, png = export_figure(chart)
        write_text(figures_dir / f"{name}.svg", svg)
        write_bytes(figures_dir / f"{name}.png", png)
    for name, frame in doc.plots.items():
        write_text(plots_dir / f"{name}.csv", frame.to_csv(index=False))
    write_text(Path(out) / "report.html", render_html(doc, vega_bundle()))
    corpus = f"{doc.corpus_used}{' (OFFLINE FALLBACK)' if doc.corpus_fallback else ''}"
    missing = sum(isinstance(t, Missing) for t in [doc.verdict, *doc.tables.values(), *shown.values()])
    tables = f"{len(doc.tables)} tables ({missing} pieces not available)"
    return f"{len(drawn)}/{len(shown)} figures, {tables}, corpus {corpus}"


def read_series_status(path: Path) -> dict | None:
    """The series stage's ``status.json`` (None when absent); :class:`ReportError` naming it when it is not one."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        status = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        status = err
    series = status.get("series") if isinstance(status, dict) else None
    if not isinstance(series, list) or not all(isinstance(s, dict) for s in series):
        why = f" ({type(status).__name__})" if isinstance(status, Exception) else ""
        raise ReportError(f"{path} is not the series stage's status file{why}; rewrite it with `dvc repro -f series`")
    return status


class ReportError(TopometricsError, ValueError):
    """An input of the report that is not what its stage writes; the message names the file and the fix."""


def render_html(report: Report, vega_bundle: str) -> str:
    """One self-contained HTML page; ``vega_bundle`` is inlined, nothing is fetched.

    First the answer beside one figure (the forest plot of the verdict when it can be drawn, else the loss
    curves), so the first screen says what was found; then the banner, what topology adds, the figures, and
    the tables with the full verdict table folded away first.
    """
    if "</script" in vega_bundle.lower():
        raise ValueError(
            "the Vega bundle contains '</script' and cannot be inlined; use vl_convert.javascript_bundle()"
        )
    lead = lead_figure(report)
    toc = "".join(f'<li><a href="#fig-{n}">Figure: {n.replace("_", " ")}</a></li>' for n in report.figures)
    toc += "".join(f'<li><a href="#{_slug(t)}">{html.escape(t)}</a></li>' for t in report.tables)
    body = ["<h1>topometrics report</h1>", _lead_html(report, lead), _banner_html(report)]
    body += [_verdict_html(report, lead), f'<nav><ol class="toc">{toc}</ol></nav>', "<h2>Figures</h2>"]
    shown = (_figure_html(n, c) for n, c in report.figures.items() if n != lead)
    body += ['<div class="figures">', *shown, "</div>"]
    body += ["<h2>Tables (ours beside the paper's)</h2>", _verdict_table_html(report.verdict)]
    body += [_table_html(title, table) for title, table in report.tables.items()]
    return _PAGE.format(style=_STYLE, bundle=vega_bundle, body="\n".join(body), embed=_EMBED)


def lead_figure(report: Report) -> str | None:
    """The figure shown beside the answer: the stopping decision's compute saved vs regret curve, else the verdict's
    forest plot, else the loss curves (None: none of them)."""
    drawn = {**report.verdict_figures, **report.figures}
    return next(
        (
            n
            for n in ("stopping_curve", "topology_forest", "loss_curves")
            if n in drawn and not isinstance(drawn[n], Missing)
        ),
        None,
    )


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


def _lead_html(report: Report, lead: str | None) -> str:
    """The answer (its sentences, and the command that makes the verdict computable) beside the lead figure."""
    answer = report.answer
    words = "".join(f"<p>{html.escape(s)}</p>" for s in answer.sentences)
    if report.corpus_fallback:  # the banner says it in full below; the first screen must not hide it
        words = '<p class="fallback">Offline fallback corpus: losses are not comparable with the paper.</p>' + words
    if answer.command:
        why = f" ({html.escape(answer.command_why)})" if answer.command_why else ""
        label = (
            "For an answer"
            if answer.for_answer
            else "To show an effect"
            if answer.computed
            else "To make it computable"
        )
        words += f'<p class="command">{label}: <code>{html.escape(answer.command)}</code>{why}</p>'
    if answer.terms:
        words += f'<p class="terms">{html.escape(answer.terms)}</p>'
    drawn = {**report.verdict_figures, **report.figures}
    figure = f'<div class="lead-figure">{_figure_html(lead, drawn[lead])}</div>' if lead else ""
    return f'<div class="lead"><section id="answer" class="answer"><h2>The answer</h2>{words}</section>{figure}</div>'


def _banner_html(report: Report) -> str:
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in report.banner.items())
    kind = "banner fallback" if report.corpus_fallback else "banner"
    return f'<table class="{kind}">{rows}</table>'


def _verdict_html(report: Report, lead: str | None) -> str:
    """What topology adds: the verdict's figures (less the one beside the answer), or why there is no verdict."""
    head = '<section id="what-topology-adds"><h2>What topology adds</h2>'
    missing = report.verdict
    words = (
        f'<p class="missing">not available: {html.escape(missing.reason)}</p>' if isinstance(missing, Missing) else ""
    )
    figures = "".join(_figure_html(n, c) for n, c in report.verdict_figures.items() if n != lead)
    return head + words + f'<div class="figures">{figures}</div></section>'


def _verdict_table_html(table: pd.DataFrame | Missing) -> str:
    """Every comparison of the verdict (scheme x fraction x family), each with its sentence, folded away."""
    if isinstance(table, Missing):
        return ""
    title = f"Verdict per scheme, fraction and family ({len(table)} comparisons, each read as a sentence)"
    return f'<details id="verdict-table"><summary>{html.escape(title)}</summary>{_table_html(title, table)}</details>'


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
div.lead { display: flex; flex-wrap: wrap; gap: 1em 3em; align-items: flex-start; }
section.answer { flex: 1 1 420px; max-width: 640px; font-size: 16px; line-height: 1.45; }
section.answer p.command code { background: #f3f3f3; padding: 2px 4px; }
section.answer p.terms { font-size: 85%; color: #555; }
section.answer p.fallback { color: #c00; font-weight: bold; }
details summary { cursor: pointer; font-weight: bold; margin-bottom: 0.5em; }
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
