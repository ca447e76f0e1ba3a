"""Stage `analysis`: statistics, fits and final-loss predictions over the runs of `analysis.variant`; writes
reports/metrics.json.

Runs before the warehouse stage (one writer per artifact): it loads the same inputs into an
in-memory DuckDB with the warehouse's own loader and SQL views, computes what SQL cannot
(topometrics.analysis), and writes the `predictions`, `fits` and `tests` tables as Parquet for the
warehouse stage to load, plus the metrics that `dvc metrics diff` compares. The between-run verdict
(`incremental_validity`, `incremental_errors`) is computed over every declared run, all variants.
"""

from pathlib import Path

import duckdb

from topometrics import analysis, metrics_file, warehouse
from topometrics.atomic import write_parquet, write_text
from topometrics.errors import run_stage, stage_parser
from topometrics.params import load_params
from topometrics.shards import params_digest


def main(argv: list[str]) -> None:
    ap = stage_parser(__doc__)
    ap.add_argument("--configs", type=Path, default=Path("data/config"))
    ap.add_argument("--runs", type=Path, default=Path("data/runs"))
    ap.add_argument("--corpus", type=Path, default=Path("data/corpus/source.json"))
    ap.add_argument("--features", type=Path, nargs="+", default=[Path("data/features")])
    ap.add_argument("--out", type=Path, default=Path("data/analysis"))
    ap.add_argument("--metrics", type=Path, default=Path("reports/metrics.json"))
    args = ap.parse_args(argv)
    declared = load_params(args.params)
    params = declared.analysis

    digest = params_digest(declared.features)  # only shards of these feature params are read
    cons = {}
    for scope, runs in (("all", declared.run_names()), ("variant", declared.run_names(params.variant))):
        inputs = warehouse.discover_inputs(
            args.configs, args.runs, args.corpus, args.features, runs=runs, feature_params=digest
        )
        for line in inputs.not_read if scope == "variant" else []:
            print(f"analysis: {line}")
        inputs = warehouse.Inputs(**(inputs.__dict__ | {"diagram_files": []}))  # the analysis never reads diagrams
        cons[scope] = duckdb.connect()
        warehouse.populate(cons[scope], inputs, params.settings(), {})
    con = cons["variant"]  # the paper's analysis is of one recipe variant at a time
    tables = analysis.run_analysis(con, params) | analysis.between_run_tables(cons["all"], params)

    args.out.mkdir(parents=True, exist_ok=True)
    for name, frame in tables.items():
        write_parquet(args.out / f"{name}.parquet", frame)
        warehouse.load_parquet(con, name, [args.out / f"{name}.parquet"])  # exactly what the warehouse will hold
    args.metrics.parent.mkdir(parents=True, exist_ok=True)
    write_text(args.metrics, metrics_file.metrics_json(metrics_file.build_metrics(con, params)))
    failed = tables["predictions"].query("status == 'failed'")
    print(f"analysis: {len(tables['predictions'])} predictions ({len(failed)} failed), -> {args.out}, {args.metrics}")


if __name__ == "__main__":
    run_stage(main)
