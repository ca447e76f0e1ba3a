"""Stage `warehouse`: build data/warehouse.duckdb from every run, feature table and analysis table.

    python stages/warehouse.py --configs data/config --runs data/runs --corpus data/corpus/source.json
        --features data/features data/series --analysis data/analysis --out data/warehouse.duckdb

The only writer of the DuckDB file. Built in a temporary file and renamed into place
(topometrics.analysis.warehouse.build_warehouse), so a killed build leaves the previous warehouse intact.
"""

from pathlib import Path

import checkout  # noqa: F401 (first: this checkout's topometrics, not the environment's)

from topometrics.analysis import warehouse
from topometrics.errors import run_stage, stage_parser
from topometrics.params import load_params


def main(argv: list[str]) -> None:
    ap = stage_parser(__doc__)
    ap.add_argument("--configs", type=Path, required=True, help="data/config: one <run>.json per declared run")
    ap.add_argument("--runs", type=Path, required=True, help="data/runs: the run directories")
    ap.add_argument("--corpus", type=Path, required=True, help="data/corpus/source.json")
    ap.add_argument("--features", type=Path, nargs="+", required=True, help="feature folders (shards, series tables)")
    ap.add_argument("--analysis", type=Path, required=True, help="data/analysis: the analysis stage's tables")
    ap.add_argument("--out", type=Path, required=True, help="the warehouse file")
    args = ap.parse_args(argv)
    params = load_params(args.params)
    sources = warehouse.Sources(args.configs, args.runs, args.corpus, args.features)
    inputs = warehouse.build_declared(params, sources, args.analysis, args.out)
    print(f"warehouse: {len(inputs.configs)} runs, {len(inputs.feature_files)} feature tables -> {args.out}")


if __name__ == "__main__":
    run_stage(main)
