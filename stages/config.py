"""Stage `config`: one config file per declared run (ladder x variants x train.seeds).

    python stages/config.py --corpus data/corpus --out data/config

Each file merges `train`, the run's variant (`variants.<name>`) and `ladder.<rung>`. DVC params
dependencies cannot express that inheritance, so this cheap stage depends on those sections and the
training stage depends on its files: a params change rewrites exactly the configs of the runs it
changes, and the training stage retrains only those (the others are complete and are skipped). The
model's vocabulary is the prepared corpus's (128 characters, or the BPE's size). The pre-registered
`analysis.primary` is checked here against the vocabulary and `features.families`, before any run trains.
"""

import json
from pathlib import Path

import checkout  # noqa: F401 (first: this checkout's topometrics, not the environment's)

from topometrics.atomic import write_text
from topometrics.errors import run_stage, stage_parser
from topometrics.models.tokens import read_record, vocab_size
from topometrics.params import SHAPE_KEYS, Params, load_params
from topometrics.training.train import build_run_config
from topometrics.verdict.verdict import check_primary


def main(argv: list[str]) -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("--corpus", type=Path, required=True, help="prepared corpus directory (source.json)")
    parser.add_argument("--out", type=Path, required=True, help="directory of <run>.json files")
    args = parser.parse_args(argv)
    params = load_params(args.params)
    check_primary(params.analysis, computed=params.features.families)  # a bad endpoint stops the sweep here
    vocab = vocab_size(read_record(args.corpus))
    args.out.mkdir(parents=True, exist_ok=True)
    for rung, variant, seed in params.runs():
        cfg = build_run_config(params, rung, seed, variant, vocab)
        path = args.out / f"{cfg.name}.json"
        text = json.dumps(cfg.to_dict(), indent=1, sort_keys=True) + "\n"
        if not path.exists() or path.read_text() != text:
            write_text(path, text)
    print(f"config: {len(params.runs())} runs ({len(params.variants) + 1} variants) -> {args.out}")
    if note := inherited_by_no_run(params):
        print(note)


def inherited_by_no_run(params: Params) -> str | None:
    """One line naming the shape keys of ``train`` that every ladder rung sets itself (so ``-S train.<key>=...``
    changes no run and retrains nothing), or None."""
    unused = [k for k in SHAPE_KEYS if all(getattr(shape, k) is not None for shape in params.ladder.values())]
    if not unused:
        return None
    keys = ", ".join(f"train.{k} = {getattr(params.train, k)}" for k in unused)
    return (f"config: note: {keys}: no run inherits it (every ladder rung sets its own), so changing it changes "
            f"nothing; set ladder.<rung>.{unused[0]} instead")  # fmt: skip


if __name__ == "__main__":
    run_stage(main)
