"""Checkpoints to feature shards through the execution seam (our runs; series: ``topometrics.series_shards``).

Every checkpoint's features and diagrams are computed by the one per-checkpoint path
(``topometrics.features`` for our checkpoints, ``topometrics.series`` for external ones) as a job
of :func:`topometrics.compute.each_result` — a local process pool or a Dask cluster, as
``compute`` says — and written as a shard (``topometrics.shards``) as soon as it arrives. A shard
whose fingerprint is current is not computed again. Then each checkpoint's distances to the
previous one (``*_prev``) are a ``distances`` shard, computed from the two diagram shards.

Fingerprint inputs: our checkpoints, the sha256 of the weights file and of the validation tokens;
hub revisions, ``<model>@<revision>`` (so a cached shard needs no download to be recognised); local
series entries, the sha256 of their files. Both add ``series.seq_len`` and the validation text's hash.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import numpy as np
import pandas as pd

from topometrics.checkpoints import Checkpoint, list_checkpoints, load_state
from topometrics.compute import each_result
from topometrics.features import (
    CheckpointFeatures,
    checkpoint_features,
    diagrams_frame,
    distance_features,
    features_frame,
    validation_batch,
)
from topometrics.model import linear_layer_names
from topometrics.params import BASE_VARIANT, ComputeParams, FeaturesParams
from topometrics.shards import (
    Fingerprint,
    ShardKey,
    ShardRun,
    Task,
    compute_shards,
    file_sha256,
    is_current,
    module_source_hash,
    params_digest,
    prune,
)
from topometrics.tokens import load_tokens

TABLES = ("features", "diagrams")


def run_shards(
    run_dir: Path,
    corpus_dir: Path,
    params: FeaturesParams,
    out: Path,
    compute: ComputeParams | None = None,
) -> ShardRun:
    """Feature, diagram and distance shards of every checkpoint of one run directory, under ``out``.

    Each shard's rung, variant and seed are those its checkpoint records (checkpoints describe
    themselves). Shards of checkpoints the run no longer has are deleted, and so is the shard of a checkpoint
    that failed this time (never a stale one left to be read). Returns what was computed, reused
    and failed (a failed checkpoint's distances to its neighbours are not computed).
    """
    ckpts = list_checkpoints(Path(run_dir))
    if not ckpts:
        raise FileNotFoundError(f"{run_dir}: no complete checkpoints (step_*.safetensors + .json); run training first")
    tokens = load_tokens(corpus_dir, "val")
    code, digest = module_source_hash(__name__), params_digest(params)
    batch = hashlib.sha256(tokens.tobytes()).hexdigest()[:16]
    tasks = []
    for ckpt in ckpts:
        name, variant = ckpt.meta.get("rung", Path(run_dir).name), ckpt.meta.get("variant", BASE_VARIANT)
        key = ShardKey(name, variant, int(ckpt.meta.get("seed", -1)), ckpt.step)
        fingerprint = Fingerprint(f"weights {file_sha256(ckpt.path)} tokens {batch}", digest, code)
        tasks.append(Task(key, fingerprint, (ckpt, tokens, params, key)))
    run = compute_shards(out, tasks, _checkpoint_tables, mapper(params, compute, "features"), TABLES)
    layers = linear_layer_names(ckpts[0].config.layers)
    run = run.merge(distance_shards(out, [t for t in tasks if t.key not in run.failed], layers, params, compute))
    prune(out, [t.key for t in tasks if t.key not in run.failed])
    return run


def distance_shards(
    root: Path, tasks: list[Task], layers: list[str], params: FeaturesParams, compute: ComputeParams | None
) -> ShardRun:
    """``distances`` shards: each checkpoint's ``*_prev`` rows against the one before it in ``tasks``.

    The fingerprint chains the two checkpoints' fingerprints, so a recomputed checkpoint also
    renews its successor's distances. Jobs carry the two diagram tables (read here).
    """
    jobs, prev = [], None
    for task in tasks:
        before = prev.fingerprint.digest if prev else "none"
        fingerprint = Fingerprint(
            f"{before} -> {task.fingerprint.digest}", task.fingerprint.params, task.fingerprint.code
        )
        job = None
        if not is_current(root, task.key, fingerprint, ("distances",)):
            previous = None if prev is None else read_table(root, prev.key, "diagrams")
            job = (previous, read_table(root, task.key, "diagrams"), layers, task.key, _extra(root, task.key))
        jobs.append(Task(task.key, fingerprint, job))
        prev = task
    return compute_shards(root, jobs, _distance_tables, mapper(params, compute, "distances"), ("distances",))


# ---------------------------------------------------------------------------
# Jobs (module level: they run in worker processes)
# ---------------------------------------------------------------------------


def _checkpoint_tables(job: tuple[Checkpoint, np.ndarray, FeaturesParams, ShardKey]) -> dict:
    ckpt, tokens, params, key = job
    batch = validation_batch(tokens, ckpt.config.context, params.rep_batch)
    result = checkpoint_features(load_state(ckpt.path), ckpt.config, batch, params)
    return frames(result, key, {})


def _distance_tables(job) -> dict:
    previous, current, layers, key, extra = job
    prev = None if previous is None else _diagrams(previous)
    result = distance_features(prev, _diagrams(current), layers)
    return {"distances": features_frame(result, key.rung, key.seed, key.step).assign(**extra)}


def frames(result: CheckpointFeatures, key: ShardKey, extra: dict) -> dict:
    return {
        "features": features_frame(result, key.rung, key.seed, key.step).assign(**extra),
        "diagrams": diagrams_frame(result, key.rung, key.seed, key.step).assign(**extra),
    }


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def mapper(params: FeaturesParams, compute: ComputeParams | None, label: str):
    return functools.partial(each_result, workers=params.workers, label=label, compute=compute)


def _diagrams(frame: pd.DataFrame) -> CheckpointFeatures:
    """The diagrams of a diagram shard back as ``{(source, layer): [H0 bars, H1 bars]}`` (finite bars)."""
    out = CheckpointFeatures()
    for (source, layer), part in frame.groupby(["source", "layer"], sort=False):
        out.diagrams[(source, layer)] = [
            part.loc[part["dim"] == dim, ["birth", "death"]].to_numpy(np.float64) for dim in (0, 1)
        ]
    return out


def read_table(root: Path, key: ShardKey, table: str) -> pd.DataFrame:
    return pd.read_parquet(key.folder(root) / f"{table}.parquet")


def _extra(root: Path, key: ShardKey) -> dict:
    """The series/revision columns of a checkpoint's feature shard (none for our runs)."""
    frame = pd.read_parquet(key.folder(root) / "features.parquet", columns=None)
    return {c: frame[c].iloc[0] for c in ("series", "revision") if c in frame.columns and len(frame)}
