"""Stage `config@<rung>`: merge `train` with `ladder.<rung>` into the rung's config file.

DVC params dependencies cannot express inheritance, so this cheap stage depends on the
whole `train` section and `ladder.<rung>`, and `train@<rung>` depends only on its output:
a params change re-trains exactly the rungs whose merged config changed.
"""

import argparse
import json
from pathlib import Path

from topometrics.params import load_params
from topometrics.train import build_rung_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rung", required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    cfg = build_rung_config(load_params(), args.rung).to_dict()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(cfg, indent=1, sort_keys=True) + "\n"
    if not args.out.exists() or args.out.read_text() != text:
        args.out.write_text(text)
    print(f"config@{args.rung}: {cfg['n_params']:,} parameters -> {args.out}")


if __name__ == "__main__":
    main()
