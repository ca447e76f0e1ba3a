"""Stage `series`: the features of external checkpoint series (Hugging Face revisions or local folders).

Never fails for want of a checkpoint: a revision that is neither cached nor downloadable is
recorded in status.json as skipped with the reason. The stage is always_changed, so a later
`dvc repro` with the hub reachable (or a filled cache) computes what was skipped.
"""

import argparse
import json
from pathlib import Path

from threadpoolctl import threadpool_limits
from transformers.utils import logging as hf_logging

from topometrics.atomic import write_parquet, write_text
from topometrics.params import load_params
from topometrics.series import run_series
from topometrics.tokens import decode, load_tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--corpus", type=Path, required=True, help="prepared corpus directory (val.u8)")
    ap.add_argument("--out", type=Path, required=True, help="features/diagrams/checkpoints.parquet, status.json")
    args = ap.parse_args()
    params = load_params()
    hf_logging.disable_progress_bar()  # one progress line per checkpoint, not a bar per file
    text = decode(load_tokens(args.corpus, "val"))
    # One BLAS thread: the per-layer SVDs are small, and extra BLAS threads only contend (docs/series.md).
    with threadpool_limits(limits=1, user_api="blas"):
        features, diagrams, checkpoints, status = run_series(
            params.series, params.features, text, progress=lambda line: print(f"series: {line}", flush=True)
        )
    args.out.mkdir(parents=True, exist_ok=True)
    write_parquet(args.out / "features.parquet", features)
    write_parquet(args.out / "diagrams.parquet", diagrams)
    write_parquet(args.out / "checkpoints.parquet", checkpoints)
    write_text(args.out / "status.json", json.dumps(status, indent=1))
    for s in status["series"]:
        note = "" if not s["skipped"] else " (see status.json; rerun `dvc repro` when the hub or cache has them)"
        print(f"series {s['name']}: {s['computed']} computed, {s['skipped']} skipped{note}")


if __name__ == "__main__":
    main()
