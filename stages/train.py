"""Stage `train@<rung>-<seed>`: train one rung with one seed from its config file, with resumable checkpoints."""

import argparse
import json
from pathlib import Path

import torch

from topometrics.atomic import write_text
from topometrics.params import load_params
from topometrics.tokens import load_tokens
from topometrics.train import RungConfig, train_rung, write_checkpoint_table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--config", type=Path, required=True, help="data/config/<rung>-<seed>.json")
    ap.add_argument("--corpus", type=Path, required=True, help="prepared corpus directory")
    ap.add_argument("--out", type=Path, required=True, help="run directory (checkpoints and logs)")
    ap.add_argument("--metrics", type=Path, required=True, help="final metrics JSON")
    ap.add_argument("--curve", type=Path, required=True, help="per-checkpoint loss table for dvc plots")
    args = ap.parse_args()
    train = load_params().train
    if train.threads:
        torch.set_num_threads(train.threads)
    cfg = RungConfig.from_dict(json.loads(args.config.read_text()))
    source = json.loads((args.corpus / "source.json").read_text())
    summary = train_rung(
        cfg,
        load_tokens(args.corpus, "train"),
        load_tokens(args.corpus, "val"),
        args.out,
        source["sha256"],
        train.device,
    )
    args.curve.parent.mkdir(parents=True, exist_ok=True)
    write_checkpoint_table(args.out, args.out / "checkpoints.csv")
    write_checkpoint_table(args.out, args.curve)
    summary["corpus"] = source["used"]
    args.metrics.parent.mkdir(parents=True, exist_ok=True)
    write_text(args.metrics, json.dumps(summary, indent=1, sort_keys=True) + "\n")
    if summary["status"] != "complete":
        print(f"train@{cfg.name}: STOPPED, {summary['status']}")
    print(
        f"train@{cfg.name}: {summary['checkpoints']} checkpoints in {args.out}, "
        f"final val loss {summary['final_val_loss']:.4f} ({summary['status']})"
    )


if __name__ == "__main__":
    main()
