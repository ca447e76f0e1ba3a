"""Stage `series`: the features of external checkpoint series (Hugging Face revisions or local folders).

Never fails for want of a checkpoint: a revision that is neither cached nor downloadable is
recorded in status.json as skipped with the reason (so is a folder of pickle weights, with how to
convert it). The stage is always_changed, so a later `dvc repro` with the hub reachable (or a
filled cache) computes what was skipped.
"""

import json
from pathlib import Path

import checkout  # noqa: F401 (first: this checkout's topometrics, not the environment's)
from threadpoolctl import threadpool_limits
from transformers.utils import logging as hf_logging

from topometrics.atomic import write_parquet, write_text
from topometrics.errors import run_stage, stage_parser
from topometrics.models.tokens import decode_prepared, load_tokens
from topometrics.params import load_params
from topometrics.series.source_shards import series_shards, summary_line


def main(argv: list[str]) -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("--corpus", type=Path, required=True, help="prepared corpus directory (val.u8)")
    parser.add_argument(
        "--out", type=Path, required=True,
        help="feature shards (docs/scaling.md), features.parquet of monitor logs, checkpoints.parquet, rungs.parquet, "
        "status.json",
    )  # fmt: skip
    args = parser.parse_args(argv)
    params = load_params(args.params)
    hf_logging.disable_progress_bar()  # one progress line per checkpoint, not a bar per file
    text = decode_prepared(args.corpus, load_tokens(args.corpus, "val"))  # each series re-tokenises it
    # One BLAS thread: the per-layer SVDs are small, and extra BLAS threads only contend (docs/series.md).
    with threadpool_limits(limits=1, user_api="blas"):
        result = series_shards(
            params.series, params.features, text, args.out, compute=params.compute,
            progress=lambda line: print(f"series: {line}", flush=True),
        )  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    write_parquet(args.out / "features.parquet", result.logged)  # monitor logs; the rest are shards
    write_parquet(args.out / "checkpoints.parquet", result.losses)
    write_parquet(args.out / "rungs.parquet", result.shapes)  # each series' model shape, for the rungs table
    status = result.status
    write_text(args.out / "status.json", json.dumps(status, indent=1))
    for s in status["series"]:
        print(summary_line(s, result.reused.get(s["name"], 0)))


if __name__ == "__main__":
    run_stage(main)
