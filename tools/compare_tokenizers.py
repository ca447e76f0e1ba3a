"""Characters against byte-level BPE through the whole pipeline: final loss in bits per byte, within-run rho.

    python tools/compare_tokenizers.py make CORPUS OUT [--vocab 512,2048] [--steps 1000] [--seeds 1,2] [--rungs tiny]
    python tools/compare_tokenizers.py show OUT

``make`` builds one temporary project per tokenizer (``OUT/char``, ``OUT/bpe512`` ...; the code of this
checkout, tools/same_results.copy_pipeline) with ``data.corpus: CORPUS``, a small recipe and no external series,
and runs ``dvc repro`` in each, the projects side by side. ``show`` prints, per tokenizer and run, the final
validation loss in nats per token and in bits per byte, and the mean within-run Spearman rho (and partial rho
given the weight norm) of the headline features with the validation loss.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import duckdb
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.same_results import copy_pipeline, start_repro  # noqa: E402

CHECKOUT = Path(__file__).resolve().parents[1]
SMALL = {
    "train": {"ckpt_every": 100, "batch_size": 32, "warmup": 100, "workers": 1, "threads": 1},
    "data": {"val_windows": 64},
    "features": {"rep_points": 200, "rep_batch": 4, "max_points": 100, "workers": 1},
    "analysis": {"bootstrap": 200},
}  # fmt: skip
SHAPES = {"tiny": {"hidden": 8, "layers": 1, "heads": 1}, "small": {"hidden": 16, "layers": 1, "heads": 2}}


def make(corpus: str, out: Path, vocabs: list[int], steps: int, seeds: list[int], rungs: list[str]) -> None:
    base = yaml.safe_load((CHECKOUT / "params.yaml").read_text())
    procs = {}
    for name, tokenizer in [("char", "char")] + [(f"bpe{v}", {"kind": "bpe", "vocab_size": v}) for v in vocabs]:
        project = out / name
        copy_pipeline(CHECKOUT, project)
        params = {section: dict(values) if isinstance(values, dict) else values for section, values in base.items()}
        for section, values in SMALL.items():
            params[section] |= values
        params["data"] |= {"corpus": corpus, "tokenizer": tokenizer}
        params["train"] |= {"steps": steps, "seeds": seeds}
        params["ladder"] = {r: SHAPES[r] for r in rungs}
        params["series"]["sources"] = {}
        (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        procs[name] = start_repro(project, out / f"{name}.log", name)
    failed = [name for name, p in procs.items() if p.wait()]
    if failed:
        sys.exit(f"error: dvc repro failed in {', '.join(failed)}; see {out}/<name>.log")


def show(out: Path) -> None:
    for project in sorted(p for p in out.iterdir() if (p / "data" / "warehouse.duckdb").exists()):
        with duckdb.connect(str(project / "data" / "warehouse.duckdb"), read_only=True) as con:
            final = con.execute(
                "SELECT rung, seed, step, val_loss, val_bpb FROM final_checkpoints WHERE kind = 'ladder' ORDER BY 1, 2"
            ).df()
            rho = con.execute(
                """SELECT feature, avg(rho) AS rho, count(*) AS runs FROM feature_loss_spearman
                   WHERE layer = 'all' AND feature IN ('vr_tp0', 'vr_tp1', 'np_norm', 'rep_tp0', 'w_spec', 'w_rankme')
                   GROUP BY feature ORDER BY feature"""
            ).df()
            partial = con.execute(
                """SELECT feature, control, avg(partial_rho) AS partial_rho FROM partial_spearman WHERE layer = 'all'
                   AND feature IN ('vr_tp0', 'vr_tp1', 'np_norm', 'rep_tp0', 'w_spec', 'w_rankme')
                   GROUP BY feature, control ORDER BY feature, control"""
            ).df()
        print(f"== {project.name}\n{final.to_string(index=False)}\n{rho.to_string(index=False)}")
        print(partial.to_string(index=False))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("make", "show"))
    ap.add_argument("args", nargs="+", help="make: CORPUS OUT; show: OUT")
    ap.add_argument("--vocab", default="512,2048")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--rungs", default="tiny")
    a = ap.parse_args(argv)
    if a.action == "make":
        corpus, out = a.args
        ints = lambda s: [int(v) for v in s.split(",") if v]  # noqa: E731
        make(corpus, Path(out), ints(a.vocab), a.steps, ints(a.seeds), a.rungs.split(","))
    else:
        show(Path(a.args[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
