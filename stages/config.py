"""Stage `config@<rung>-<seed>`: merge `train` with `ladder.<rung>` into one run's config file.

DVC params dependencies cannot express inheritance, so this cheap stage depends on the
whole `train` section and `ladder.<rung>`, and `train@<rung>-<seed>` depends only on its
output: a params change re-trains exactly the runs whose merged config changed (adding a
seed to `train.seeds` rewrites no existing file, so it trains only the new runs).
"""

import argparse
import json
from pathlib import Path

from topometrics.atomic import write_text
from topometrics.params import load_params, run_name
from topometrics.train import build_rung_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rung", required=True)
    ap.add_argument("--seed", type=int, required=True, help="one of train.seeds")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    cfg = build_rung_config(load_params(), args.rung, args.seed).to_dict()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(cfg, indent=1, sort_keys=True) + "\n"
    if not args.out.exists() or args.out.read_text() != text:
        write_text(args.out, text)
    print(f"config@{run_name(args.rung, args.seed)}: {cfg['n_params']:,} parameters -> {args.out}")


if __name__ == "__main__":
    main()
