"""Stage `corpus`: resolve data.corpus (WikiText-2 download, local text, or the offline fallback)."""

import argparse
import json
from pathlib import Path

from topometrics.corpus import prepare
from topometrics.params import load_params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True, help="prepared corpus directory")
    args = ap.parse_args()
    d = load_params().data
    source = prepare(d.corpus, d.urls, d.download_timeout_s, d.val_fraction, args.out)
    state = "wrote" if source.pop("changed") else "kept"
    print(
        f"corpus: {state} {args.out} ({source['used']}, {source['train_tokens']:,} train / "
        f"{source['val_tokens']:,} val tokens){' FALLBACK: ' + source['reason'] if source['fallback'] else ''}"
    )
    print(json.dumps(source, sort_keys=True))


if __name__ == "__main__":
    main()
