"""Stage `report`: the offline HTML report, its figures (PNG/SVG) and the DVC plot files, from the warehouse.

    python stages/report.py --warehouse data/warehouse.duckdb --series-status data/series/status.json --out reports

Reads the warehouse read-only; a missing status file of the series stage is shown as such in the banner.
"""

import time
from pathlib import Path

import checkout  # noqa: F401 (first: this checkout's topometrics, not the environment's)

from topometrics.errors import run_stage, stage_parser
from topometrics.report.html import write_report


def main(argv: list[str]) -> None:
    ap = stage_parser(__doc__)
    ap.add_argument("--warehouse", type=Path, required=True, help="data/warehouse.duckdb (opened read-only)")
    ap.add_argument("--series-status", type=Path, required=True, help="the series stage's status.json (may be absent)")
    ap.add_argument("--out", type=Path, required=True, help="reports/: report.html, figures/, plots/")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    summary = write_report(args.warehouse, args.series_status, args.out)
    print(f"report: {args.out / 'report.html'}, {summary}, {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    run_stage(main)
