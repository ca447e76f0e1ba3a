"""The cost of verifying content: ``python -m bench verify [--repeats N] [--checkpoints N]``.

Every check is timed beside the unchecked path it extends, interleaved in the same run (so machine
load affects both alike), on files of the real sizes:

- **checkpoints**: a run of the default ``xl`` rung (hidden 48, 3 layers, context 128; 51
  checkpoints, as 5,000 steps with one every 100 leave). ``verify_checkpoint`` of every step (what
  the train stage runs before it calls a run complete) against the structure check it extends
  (the sidecar read and ``safetensors_problem``: header and size); and writing a checkpoint with its
  sha256 (``save_checkpoint``, hashed in memory) against ``safetensors.torch.save_file`` with the
  same sidecar.
- **tokens**: ``load_tokens`` of a WikiText-2-sized training split (10,918,892 ids) checked
  against its ``source.json`` against ``np.fromfile`` of the same file.
- **shards**: the ``features`` and ``diagrams`` shard of one real xl checkpoint (its features
  computed with the default params): ``is_current`` (fingerprint and data-page hash) against the
  footer-only fingerprint check; writing them (two encodings, the hash in the footer) against one
  ``pq.write_table`` each.

Prints medians in milliseconds and the ratios, and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from safetensors.torch import save_file

from bench import PARAMS_YAML
from bench.np import median_ms
from topometrics.execution.shards import (
    META_KEY,
    Fingerprint,
    ShardKey,
    is_current,
    stored_fingerprint,
    write_shard,
)
from topometrics.features.checkpoint import checkpoint_features, diagrams_frame, features_frame
from topometrics.features.forward import validation_batch
from topometrics.models.checkpoints import checkpoint_path, safetensors_problem, save_checkpoint, verify_checkpoint
from topometrics.models.model import GPT, GPTConfig
from topometrics.models.tokens import load_tokens, tokens_sha256
from topometrics.params import load_params

XL = GPTConfig(hidden=48, layers=3, heads=4, context=128)
WIKITEXT_TRAIN_TOKENS = 10_918_892


def pair(name: str, checked, unchecked, repeats: int) -> dict:
    """Median ms of ``checked`` and ``unchecked``, alternated, and their ratio; printed as one line."""
    ms_checked, ms_unchecked = [], []
    for _ in range(repeats):  # alternate so load drifts reach both
        ms_unchecked.append(median_ms(unchecked, 1))
        ms_checked.append(median_ms(checked, 1))
    a, b = float(np.median(ms_checked)), float(np.median(ms_unchecked))
    print(f"{name:34s} checked {a:9.2f} ms   unchecked {b:9.2f} ms   ratio {a / b:5.2f}")
    return {"checked_ms": round(a, 3), "unchecked_ms": round(b, 3), "ratio": round(a / b, 3)}


def write_run(run_dir: Path, checkpoints: int) -> GPT:
    """``checkpoints`` xl checkpoints (the initial weights, scaled per step so no two files are equal)."""
    run_dir.mkdir(parents=True)
    model = GPT(XL)
    model.init_weights(torch.Generator().manual_seed(0))
    for i in range(checkpoints):
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.0 + 1e-3)
        save_checkpoint(run_dir, model, sidecar(i * 100))
    return model


def sidecar(step: int) -> dict:
    return {"step": step, "rung": "xl", "seed": 42, "config": XL.to_dict(), "recipe_fingerprint": "bench"}


def structure_only(run_dir: Path, steps: list[int]) -> None:
    """What a run's checkpoints were checked with before content hashes: sidecar, header and size."""
    for step in steps:
        path = checkpoint_path(run_dir, step)
        json.loads(path.with_suffix(".json").read_text())
        safetensors_problem(path)


def save_unhashed(run_dir: Path, model: GPT) -> None:
    """A checkpoint as written before content hashes: ``save_file`` to a temporary name, renamed, then the sidecar."""
    path = checkpoint_path(run_dir, 999_900)
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(path) + ".tmp")
    os.replace(str(path) + ".tmp", path)
    path.with_suffix(".json").write_text(json.dumps(sidecar(999_900), indent=1, sort_keys=True))


def bench_checkpoints(root: Path, checkpoints: int, repeats: int) -> dict:
    run_dir = root / "xl-42"
    model = write_run(run_dir, checkpoints)
    steps = [i * 100 for i in range(checkpoints)]
    size = sum(checkpoint_path(run_dir, s).stat().st_size for s in steps)
    print(f"checkpoints: {checkpoints} xl checkpoints, {size / 2**20:.1f} MiB")
    verify = pair("is a run complete (all checkpoints)", lambda: [verify_checkpoint(run_dir, s) for s in steps],
                  lambda: structure_only(run_dir, steps), repeats)  # fmt: skip
    write = pair("write one checkpoint", lambda: save_checkpoint(run_dir, model, sidecar(999_900)),
                 lambda: save_unhashed(run_dir, model), repeats)  # fmt: skip
    return {"checkpoints": checkpoints, "mib": round(size / 2**20, 2), "verify_run": verify, "write": write}


def bench_tokens(root: Path, repeats: int) -> dict:
    corpus = root / "corpus"
    corpus.mkdir()
    ids = np.random.default_rng(0).integers(32, 127, WIKITEXT_TRAIN_TOKENS, dtype=np.uint8)
    ids.tofile(corpus / "train.u8")
    record = {"train_tokens": int(ids.size), "tokens_sha256": {"train": tokens_sha256(ids)}}
    (corpus / "source.json").write_text(json.dumps(record))
    print(f"tokens: {ids.size:,} ids")
    checked = pair("read the training split", lambda: load_tokens(corpus, "train"),
                   lambda: np.fromfile(corpus / "train.u8", dtype=np.uint8), repeats)  # fmt: skip
    return {"tokens": int(ids.size), "load": checked}


def real_shard_tables() -> dict:
    """The ``features`` and ``diagrams`` tables of one xl checkpoint under the default feature params."""
    model = GPT(XL)
    model.init_weights(torch.Generator().manual_seed(0))
    params = dataclasses.replace(load_params(PARAMS_YAML).features, workers=1)
    tokens = np.random.default_rng(1).integers(32, 127, params.rep_batch * XL.context + 1, dtype=np.uint8)
    result = checkpoint_features(model.state_dict(), XL, validation_batch(tokens, XL.context, params.rep_batch), params)
    return {"features": features_frame(result, "xl", 42, 0), "diagrams": diagrams_frame(result, "xl", 42, 0)}


def write_unhashed(folder: Path, fingerprint: Fingerprint, tables: dict) -> None:
    """Shard files as written before content hashes: one encoding each, the fingerprint in the footer, renamed."""
    folder.mkdir(exist_ok=True)
    for name, frame in tables.items():
        table = pa.Table.from_pandas(frame, preserve_index=False)
        metadata = {**(table.schema.metadata or {}), META_KEY.encode(): fingerprint.to_json().encode()}
        pq.write_table(table.replace_schema_metadata(metadata), folder / f"{name}.tmp")
        os.replace(folder / f"{name}.tmp", folder / f"{name}.parquet")


def bench_shards(root: Path, repeats: int) -> dict:
    tables, key, fingerprint = real_shard_tables(), ShardKey("xl", "base", 42, 0), Fingerprint("w", "p", "c")
    write_shard(root / "shards", key, fingerprint, tables)
    folder = key.folder(root / "shards")
    size = sum(p.stat().st_size for p in folder.iterdir())
    rows = {name: len(frame) for name, frame in tables.items()}
    print(f"shards: one checkpoint's features ({rows['features']} rows) and diagrams ({rows['diagrams']} rows), "
          f"{size / 1024:.0f} KiB")  # fmt: skip
    footers = [folder / f"{t}.parquet" for t in tables]
    current = pair("is a shard current", lambda: is_current(root / "shards", key, fingerprint, tables),
                   lambda: [stored_fingerprint(path) == fingerprint for path in footers], repeats)  # fmt: skip
    write = pair("write a shard", lambda: write_shard(root / "again", key, fingerprint, tables),
                 lambda: write_unhashed(root / "unhashed", fingerprint, tables), repeats)  # fmt: skip
    return {"rows": rows, "kib": round(size / 1024, 1), "is_current": current, "write": write}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench verify")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--checkpoints", type=int, default=51, help="checkpoints of the xl run (default 5000/100+1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        result = {
            "checkpoints": bench_checkpoints(root, args.checkpoints, args.repeats),
            "tokens": bench_tokens(root, args.repeats),
            "shards": bench_shards(root, args.repeats),
        }
    print(json.dumps(result, sort_keys=True))
    return 0
