"""Stage `plots_page`: the HTML template `dvc plots show`/`diff` fill, with Vega inlined so the page draws offline.

    python stages/plots_page.py --out reports/plots/page.html

`.dvc/config` names the page (`plots.html_template`); written from the installed vl-convert, DVC-cached.
"""

from pathlib import Path

import checkout  # noqa: F401 (first: this checkout's topometrics, not the environment's)

from topometrics.atomic import write_text
from topometrics.errors import run_stage, stage_parser
from topometrics.report.plots_page import DVC_VL_VERSION, page_template, vega_bundle


def main(argv: list[str]) -> None:
    ap = stage_parser(__doc__)
    ap.add_argument("--out", type=Path, required=True, help="reports/plots/page.html")
    args = ap.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text(args.out, page_template(vega_bundle()))
    print(f"plots_page: {args.out} (Vega-Lite {DVC_VL_VERSION}, {args.out.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    run_stage(main)
