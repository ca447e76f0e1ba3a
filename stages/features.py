"""DVC stage features@<rung>-<seed>: topological and spectral features of every checkpoint of one run.

    python stages/features.py --runs data/runs/tiny-42 --corpus data/corpus --out data/features/tiny-42

Writes one shard per checkpoint into --out (``rung=<rung>/variant=<variant>/seed=<seed>/step=<step>/``
as the checkpoints record them, with ``features``, ``diagrams`` and ``distances`` Parquet files;
tables: docs/features.md, shards: docs/scaling.md). Shards that are current are kept, so a killed
run resumes. ``compute.cluster`` says where the checkpoints are computed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from topometrics.errors import run_stage, stage_parser
from topometrics.feature_shards import run_shards
from topometrics.params import load_params


def main(argv: list[str]) -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("--runs", type=Path, required=True, help="the run directory (data/runs/<rung>-<seed>)")
    parser.add_argument("--corpus", type=Path, required=True, help="prepared corpus directory (val.u8)")
    parser.add_argument("--out", type=Path, required=True, help="output directory (shards)")
    args = parser.parse_args(argv)
    params = load_params(args.params)
    start = time.monotonic()
    run = run_shards(args.runs, args.corpus, params.features, args.out, params.compute)
    keys = set(run.computed) | set(run.reused) | set(run.failed)
    print(
        f"features@{args.runs.name}: {len(keys)} checkpoints, {len(set(run.computed))} computed, "
        f"{len(keys - set(run.computed) - set(run.failed))} already current, {len(run.failed)} failed, "
        f"{time.monotonic() - start:.1f} s -> {args.out}"
    )
    if run.failed:
        first, reason = next(iter(run.failed.items()))
        print(
            f"error: features@{args.runs.name}: {len(run.failed)} checkpoints failed (step {first.step}: {reason}); "
            "the others are written, re-run to retry them",
            file=sys.stderr,
        )
        sys.exit(1)


if __name__ == "__main__":
    run_stage(main)
