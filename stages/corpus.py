"""Stage `corpus`: resolve data.corpus (WikiText-2 download, local text, or the offline fallback).

    python stages/corpus.py --out data/corpus

Refuses a remote's credential in the tracked .dvc/config (topometrics/remote_secrets.py), and a corpus
whose splits are shorter than one window of data.seq_len, or more of whose characters than
data.max_unknown_share fall outside the tokenizer's ASCII range, before touching --out. With
data.tokenizer: {kind: bpe, vocab_size: N} it trains a byte-level BPE on the training split (tokenizer.json).
"""

from pathlib import Path

import checkout  # noqa: F401 (first: this checkout's topometrics, not the environment's)

from topometrics.errors import run_stage, stage_parser
from topometrics.params import load_params
from topometrics.remote_secrets import check_remote_secrets
from topometrics.training.corpus import prepare, summary


def main(argv: list[str]) -> None:
    ap = stage_parser(__doc__)
    ap.add_argument("--out", type=Path, required=True, help="prepared corpus directory")
    args = ap.parse_args(argv)
    d = load_params(args.params).data
    check_remote_secrets()  # the first stage: a credential in the tracked .dvc/config stops the pipeline here
    source = prepare(
        d.corpus, d.urls, d.download_timeout_s, d.val_fraction, args.out, d.seq_len, d.max_unknown_share, d.tokenizer
    )
    print(summary(source, args.out))


if __name__ == "__main__":
    run_stage(main)
