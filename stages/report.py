"""Stage `report`: the offline HTML report, its figures (PNG/SVG) and the DVC plot files, from the warehouse."""

import json
import time
from pathlib import Path

from topometrics import report, report_html, warehouse
from topometrics.atomic import write_bytes, write_text
from topometrics.errors import run_stage, stage_parser
from topometrics.report_frames import Missing, load


def main(argv: list[str]) -> None:
    ap = stage_parser(__doc__)
    ap.add_argument("--warehouse", type=Path, required=True, help="data/warehouse.duckdb (opened read-only)")
    ap.add_argument("--series-status", type=Path, help="data/series/status.json of the series stage (optional)")
    ap.add_argument("--out", type=Path, required=True, help="reports/: report.html, figures/, plots/")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    status = None
    if args.series_status is not None and args.series_status.exists():
        status = json.loads(args.series_status.read_text())
    with warehouse.connect_read_only(args.warehouse) as con:
        doc = report.build(load(con), status)
    figures_dir, plots_dir = args.out / "figures", args.out / "plots"
    figures_dir.mkdir(parents=True, exist_ok=True)
    plots_dir.mkdir(parents=True, exist_ok=True)
    shown = {**doc.verdict_figures, **doc.figures}
    drawn = {name: chart for name, chart in shown.items() if not isinstance(chart, Missing)}
    for name, chart in drawn.items():
        svg, png = report_html.export_figure(chart)
        write_text(figures_dir / f"{name}.svg", svg)
        write_bytes(figures_dir / f"{name}.png", png)
    for name, frame in doc.plots.items():
        write_text(plots_dir / f"{name}.csv", frame.to_csv(index=False))
    write_text(args.out / "report.html", report_html.render_html(doc, report_html.vega_bundle()))
    corpus = f"{doc.corpus_used}{' (OFFLINE FALLBACK)' if doc.corpus_fallback else ''}"
    missing = sum(isinstance(t, Missing) for t in [doc.verdict, *doc.tables.values(), *shown.values()])
    print(
        f"report: {args.out / 'report.html'}, {len(drawn)}/{len(shown)} figures, "
        f"{len(doc.tables)} tables ({missing} pieces not available), corpus {corpus}, "
        f"{time.perf_counter() - start:.1f}s"
    )


if __name__ == "__main__":
    run_stage(main)
