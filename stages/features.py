"""DVC stage features@<rung>-<seed>: topological and spectral features of every checkpoint of one run.

    python stages/features.py --rung tiny --runs data/runs/tiny-42 --corpus data/corpus --out data/features/tiny-42

Writes ``features.parquet`` and ``diagrams.parquet`` into --out (tables: docs/features.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from topometrics.atomic import write_parquet
from topometrics.features import run_features
from topometrics.params import load_params


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rung", required=True, help="rung name, e.g. tiny")
    parser.add_argument("--runs", type=Path, required=True, help="the run directory (data/runs/<rung>-<seed>)")
    parser.add_argument("--corpus", type=Path, required=True, help="prepared corpus directory (val.u8)")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    params = load_params(args.params).features
    start = time.monotonic()
    features, diagrams = run_features(args.runs, args.corpus, params, args.rung)
    args.out.mkdir(parents=True, exist_ok=True)
    write_parquet(args.out / "features.parquet", features)
    write_parquet(args.out / "diagrams.parquet", diagrams)
    nulls = int(features.value.isna().sum())
    print(
        f"features@{args.runs.name}: {features.step.nunique()} checkpoints, {len(features)} feature rows "
        f"({nulls} NULL), {len(diagrams)} diagram bars, {time.monotonic() - start:.1f} s -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
