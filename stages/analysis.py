"""Stage `analysis`: statistics, fits and final-loss predictions over the runs of `analysis.variant`; writes
reports/metrics.json.

    python stages/analysis.py --configs data/config --runs data/runs --corpus data/corpus/source.json
        --features data/features --out data/analysis --metrics reports/metrics.json

Runs before the warehouse stage (one writer per artifact): it loads the same inputs into an
in-memory DuckDB with the warehouse's own loader and SQL views, computes what SQL cannot
(topometrics.analysis.tables), and writes the `predictions`, `fits` and `tests` tables as Parquet for the
warehouse stage to load, plus the metrics that `dvc metrics diff` compares. The between-run verdict
(`incremental_validity`, `incremental_errors`) is computed over every declared run, all variants.
"""

from pathlib import Path

import checkout  # noqa: F401 (first: this checkout's topometrics, not the environment's)

from topometrics.analysis.metrics_file import write_analysis
from topometrics.analysis.warehouse import Sources
from topometrics.errors import run_stage, stage_parser
from topometrics.params import load_params


def main(argv: list[str]) -> None:
    ap = stage_parser(__doc__)
    ap.add_argument("--configs", type=Path, required=True, help="data/config: one <run>.json per declared run")
    ap.add_argument("--runs", type=Path, required=True, help="data/runs: the run directories")
    ap.add_argument("--corpus", type=Path, required=True, help="data/corpus/source.json")
    ap.add_argument("--features", type=Path, nargs="+", required=True, help="feature folders (shards)")
    ap.add_argument("--out", type=Path, required=True, help="data/analysis: the tables as Parquet")
    ap.add_argument("--metrics", type=Path, required=True, help="reports/metrics.json")
    args = ap.parse_args(argv)
    params = load_params(args.params)
    sources = Sources(args.configs, args.runs, args.corpus, args.features)
    summary = write_analysis(params, sources, args.out, args.metrics)
    print(f"analysis: {summary}, -> {args.out}, {args.metrics}")


if __name__ == "__main__":
    run_stage(main)
