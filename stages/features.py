"""DVC stage features@<rung>-<seed>: topological and spectral features of every checkpoint of one run.

    python stages/features.py --runs data/runs/tiny-42 --corpus data/corpus --out data/features/tiny-42

Writes one shard per checkpoint into --out (``rung=<rung>/variant=<variant>/seed=<seed>/step=<step>/``
as the checkpoints record them, with ``features``, ``diagrams`` and ``distances`` Parquet files;
tables: docs/features.md, shards: docs/scaling.md). Shards that are current are kept, so a killed
run resumes. ``compute.cluster`` says where the checkpoints are computed. A checkpoint that fails
fails the stage after the others are written (topometrics.features.run_shards.run_shards).
"""

from pathlib import Path

from topometrics.errors import run_stage, stage_parser
from topometrics.features.run_shards import run_shards
from topometrics.params import load_params


def main(argv: list[str]) -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("--runs", type=Path, required=True, help="the run directory (data/runs/<rung>-<seed>)")
    parser.add_argument("--corpus", type=Path, required=True, help="prepared corpus directory (val.u8)")
    parser.add_argument("--out", type=Path, required=True, help="output directory (shards)")
    args = parser.parse_args(argv)
    params = load_params(args.params)
    run_shards(args.runs, args.corpus, params.features, args.out, params.compute, progress=print)


if __name__ == "__main__":
    run_stage(main)
