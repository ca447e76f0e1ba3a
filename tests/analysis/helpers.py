"""Helpers shared by the analysis, report and warehouse tests: ``write_inputs`` builds a synthetic ladder in the
input contract (configs, steps/checkpoints CSVs, features/diagrams Parquet, corpus source.json)."""

import json
from pathlib import Path

import numpy as np
import pandas as pd

from topometrics.analysis import warehouse
from topometrics.analysis.predict import Schedule, multi_power_law
from topometrics.analysis.warehouse import Inputs
from topometrics.measures.layer_features import aggregate_layers
from topometrics.params import run_name

RUNGS = {"tiny": 2936, "small": 7408, "medium": 20640, "large": 46368, "xl": 97200}


LAYERS = ("block0.attn.qkv", "block0.mlp.in")


def write_inputs(root: Path, rungs=RUNGS, seeds=(42,), steps=2000, ckpt_every=50, warmup=100) -> Inputs:
    """A synthetic ladder: power-law loss curves whose floor falls with N, features that track the loss.

    Some feature values are rounded so that the Spearman views meet ties; one value is NULL with a reason.
    """
    rng = np.random.default_rng(0)
    sched = Schedule(steps, warmup, 3e-3, 0.0)
    for rung, n_params in rungs.items():
        floor = 1.2 * (n_params / 3000) ** -0.144 + 0.5
        for seed in seeds:
            name = run_name(rung, seed)
            recipe = {"steps": steps, "ckpt_every": ckpt_every, "batch_size": 8, "lr": 3e-3, "warmup": warmup}
            recipe |= {"min_lr_ratio": 0.0, "weight_decay": 0.01, "grad_clip": 1.0, "seed": seed, "val_windows": 4}
            model = {"vocab_size": 128, "context": 16, "hidden": 8, "layers": 1, "heads": 1}
            cfg = {"rung": rung, "variant": "base", "seed": seed, "n_params": n_params, "model": model}
            cfg |= {"recipe": recipe}
            _write(root / "config" / f"{name}.json", json.dumps(cfg))
            t = np.arange(1, steps + 1)
            # a schedule-aware curve (the annealing bonus is what a plain power law in t misses)
            curve = multi_power_law(np.arange(0, steps + 1), sched, floor, 0.5, 0.5, 0.3, 2.0)
            loss = curve[1:] + rng.normal(0, 0.01, steps)
            run = root / "runs" / name
            run.mkdir(parents=True, exist_ok=True)
            grad = 1 / np.sqrt(t) + rng.normal(0, 0.01, steps)
            pd.DataFrame({"step": t, "train_loss": loss, "grad_norm": grad, "lr": sched.rate(t)}).to_csv(
                run / "steps.csv", index=False
            )
            ck = np.arange(0, steps + 1, ckpt_every)
            val = np.round(curve[ck] + rng.normal(0, 0.003, len(ck)), 3)
            pd.DataFrame({"step": ck, "val_loss": val, "train_loss": val + 0.01}).to_csv(
                run / "checkpoints.csv", index=False
            )
            feats = _features(rung, seed, ck, val, n_params, rng)
            _write_parquet(root / "features" / name / "features.parquet", feats)
            diag = pd.DataFrame(
                {"rung": rung, "seed": seed, "step": 0, "source": "weights", "layer": LAYERS[0], "dim": [0, 0, 1]}
                | {"birth": [0.0, 0.0, 0.2], "death": [0.5, np.inf, 0.3]}
            )
            _write_parquet(root / "features" / name / "diagrams.parquet", diag)
    src = {"requested": "wikitext-2-raw-v1", "used": "python-docs", "sha256": "ab" * 32}
    _write(root / "corpus" / "source.json", json.dumps(src | {"reason": "offline", "fallback": True}))
    return warehouse.discover_inputs(
        warehouse.Sources(root / "config", root / "runs", root / "corpus" / "source.json", [root / "features"])
    )


def _features(rung, seed, steps, val, n_params, rng) -> pd.DataFrame:
    """Per-layer values of real feature names, and their layer-'all' rows from the features stage's own
    aggregation (``topometrics.measures.layer_features.aggregate_layers``), so the names are exactly those it writes."""
    progress = 1 - np.exp(-steps / 300)
    per_layer = {
        "np_norm": 0.3 + 0.2 * progress + rng.normal(0, 0.005, len(steps)),
        "vr_tp0": np.log(n_params) * (6 - val) + rng.normal(0, 0.05, len(steps)),
        "vr_tp1": np.round(1 + progress + rng.normal(0, 0.3, len(steps)), 1),  # ties
        "w_fro": 5 + 3 * progress + rng.normal(0, 0.05, len(steps)),
        "w_spec": 2 + progress + rng.normal(0, 0.2, len(steps)),
    }
    # the second layer drifts away from the first as training progresses (so the std over layers varies)
    layers = {layer: {k: v + j * 0.01 * progress for k, v in per_layer.items()} for j, layer in enumerate(LAYERS)}
    rows = []
    for layer, values_of in layers.items():
        for feature, values in values_of.items():
            rows.append(pd.DataFrame({"step": steps, "layer": layer, "feature": feature, "value": values}))
    for i, step in enumerate(steps):
        model = aggregate_layers(
            {layer: {k: v[i] for k, v in values_of.items()} for layer, values_of in layers.items()}
        )
        rows.append(pd.DataFrame({"step": step, "layer": "all", "feature": list(model), "value": list(model.values())}))
    out = pd.concat(rows, ignore_index=True).assign(rung=rung, seed=seed, reason=None)
    out.loc[0, ["value", "reason"]] = [np.nan, "diverged checkpoint"]  # NaN becomes NULL in Parquet
    return out[["rung", "seed", "step", "layer", "feature", "value", "reason"]]


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _write_parquet(path: Path, frame: pd.DataFrame) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(path, index=False)
