"""Stage `warehouse`: build data/warehouse.duckdb from every run, feature table and analysis table.

The only writer of the DuckDB file. Built in a temporary file and renamed into place
(topometrics.warehouse.build_warehouse), so a killed build leaves the previous warehouse intact.
"""

import json
from pathlib import Path

from topometrics import warehouse
from topometrics.errors import run_stage, stage_parser
from topometrics.params import as_dict, load_params
from topometrics.shards import params_digest


def main(argv: list[str]) -> None:
    ap = stage_parser(__doc__)
    ap.add_argument("--configs", type=Path, default=Path("data/config"))
    ap.add_argument("--runs", type=Path, default=Path("data/runs"))
    ap.add_argument("--corpus", type=Path, default=Path("data/corpus/source.json"))
    ap.add_argument("--features", type=Path, nargs="+", default=[Path("data/features")])
    ap.add_argument("--analysis", type=Path, default=Path("data/analysis"))
    ap.add_argument("--out", type=Path, default=Path("data/warehouse.duckdb"))
    args = ap.parse_args(argv)
    params = load_params(args.params)
    settings = params.analysis.settings()

    runs = params.run_names()
    digest = params_digest(params.features)  # only shards of these feature params are read
    inputs = warehouse.discover_inputs(args.configs, args.runs, args.corpus, args.features, args.analysis, runs, digest)
    for line in inputs.not_read:
        print(f"warehouse: {line}")
    declared = {k: v for k, v in as_dict(params).items() if k != "compute"}  # where it ran is not a result
    meta = {"code_version": warehouse.git_describe(), "params": json.dumps(declared, sort_keys=True)}
    path = warehouse.build_warehouse(args.out, inputs, settings, meta)
    print(f"warehouse: {len(inputs.configs)} runs, {len(inputs.feature_files)} feature tables -> {path}")


if __name__ == "__main__":
    run_stage(main)
