"""DVC stage `features`: topological and spectral features of every checkpoint of every declared run.

    python stages/features.py --runs data/runs --corpus data/corpus --out data/features

One process for every run (ladder x variants x train.seeds): the checkpoints of all runs are computed as one
batch (topometrics.features.sweep.sweep_shards). Each run's shards go to ``--out/<run>/``
(``rung=<rung>/variant=<variant>/seed=<seed>/step=<step>/`` as the checkpoints record them, with ``features``,
``diagrams`` and ``distances`` Parquet files; tables: docs/features.md, shards: docs/scaling.md). Shards
that are current are kept, so a killed stage resumes and an unchanged run costs the hashing of its
checkpoints. ``compute.cluster`` says where the checkpoints are computed. A checkpoint that fails fails the
stage after the others are written.
"""

from pathlib import Path

import checkout  # noqa: F401 (first: this checkout's topometrics, not the environment's)

from topometrics.errors import run_stage, stage_parser
from topometrics.features.sweep import RunShards, sweep_shards
from topometrics.params import load_params


def main(argv: list[str]) -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("--runs", type=Path, required=True, help="parent of the run directories (data/runs)")
    parser.add_argument("--corpus", type=Path, required=True, help="prepared corpus directory (val.u8)")
    parser.add_argument("--out", type=Path, required=True, help="parent of each run's shard folder (data/features)")
    args = parser.parse_args(argv)
    params = load_params(args.params)
    runs = [RunShards(args.runs / name, args.out / name) for name in params.run_names()]
    sweep_shards(runs, args.corpus, params.features, params.compute, progress=print)


if __name__ == "__main__":
    run_stage(main)
