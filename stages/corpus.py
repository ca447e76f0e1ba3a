"""Stage `corpus`: resolve data.corpus (WikiText-2 download, local text, or the offline fallback).

    python stages/corpus.py --out data/corpus

Refuses a corpus whose splits are shorter than one window of data.seq_len before touching --out.
"""

import json
from pathlib import Path

from topometrics.corpus import prepare
from topometrics.errors import run_stage, stage_parser
from topometrics.params import load_params


def main(argv: list[str]) -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("--out", type=Path, required=True, help="prepared corpus directory")
    args = parser.parse_args(argv)
    d = load_params(args.params).data
    source = prepare(d.corpus, d.urls, d.download_timeout_s, d.val_fraction, args.out, d.seq_len)
    state = "wrote" if source.pop("changed") else "kept"
    print(
        f"corpus: {state} {args.out} ({source['used']}, {source['train_tokens']:,} train / "
        f"{source['val_tokens']:,} val tokens){' FALLBACK: ' + source['reason'] if source['fallback'] else ''}"
    )
    print(json.dumps(source, sort_keys=True))


if __name__ == "__main__":
    run_stage(main)
