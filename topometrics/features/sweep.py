"""Every run of a sweep to feature shards in one process (the features stage; one run: :func:`run_shards`).

The checkpoints of all runs are one batch of jobs through the execution seam (one process pool or Dask
cluster, balanced across runs), their distances a second batch; each shard is written under its own run's
folder as it arrives. A shard whose fingerprint is current is not computed again, so a sweep whose shards
are all current costs the hashing of its checkpoints and nothing more: one DVC stage for every run, not one
per run (DVC's bookkeeping grows with the square of the number of stages, and a process per run paid its
imports again). The jobs, fingerprints and distances are ``topometrics.features.run_shards``'.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from topometrics.execution.shards import (
    Fingerprint,
    ShardKey,
    ShardRun,
    Task,
    compute_shards,
    module_source_hash,
    params_digest,
    prune,
)
from topometrics.features.run_shards import (
    TABLES,
    CheckpointJob,
    checkpoint_tables,
    distance_tables,
    distance_tasks,
    mapper,
    relabelled,
    run_iterates,
    verified_weights,
)
from topometrics.models.checkpoints import CheckpointError, list_checkpoints
from topometrics.models.model import linear_layer_names
from topometrics.models.tokens import load_tokens, read_record, token_bytes
from topometrics.params import BASE_VARIANT, FeaturesParams
from topometrics.params_sources import ComputeParams
from topometrics.training.run_dir import directory_owner


@dataclass(frozen=True)
class RunShards:
    """One run of a sweep: its run directory and the folder its shards go to."""

    run_dir: Path
    out: Path


def run_shards(
    run_dir: Path,
    corpus_dir: Path,
    params: FeaturesParams,
    out: Path,
    compute: ComputeParams | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> ShardRun:
    """Feature, diagram and distance shards of every checkpoint of one run directory, under ``out``:
    :func:`sweep_shards` of that one run (its line is always printed)."""
    return sweep_shards([RunShards(Path(run_dir), Path(out))], corpus_dir, params, compute, progress)[Path(run_dir)]


def sweep_shards(
    runs: list[RunShards],
    corpus_dir: Path,
    params: FeaturesParams,
    compute: ComputeParams | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> dict[Path, ShardRun]:
    """Feature, diagram and distance shards of every checkpoint of every run, each run under its ``out``,
    in one process: the checkpoints of all runs are one batch of jobs through the execution seam (one pool
    or cluster, balanced across runs), then their distances another. Returns each run's :class:`ShardRun`
    by run directory.

    Each shard's rung, variant and seed are those its checkpoint records (checkpoints describe
    themselves). Shards of checkpoints a run no longer has are deleted, and so is the shard of a checkpoint
    that failed this time (never a stale one left to be read). ``progress`` gets one line per run that
    computed or failed something (every run's when there is one run) and a summary line over several.
    Raises :class:`CheckpointError` after writing the others, naming the runs without checkpoints and the
    checkpoints that failed (their distances to their neighbours are not computed).
    """
    start = time.monotonic()
    inputs = _validation_inputs(Path(corpus_dir), params)
    planned, missing = {}, {}
    for run in runs:
        try:
            planned[run.run_dir] = _plan_run(run, inputs, params, progress)
        except CheckpointError as err:
            missing[run.run_dir] = str(err)
    todo = [t for tasks, failed, _ in planned.values() for t in tasks if t.key not in failed]
    # a sweep's recipes of one rung and seed start from the same weights: their first checkpoints are computed once
    own = compute_shards(None, todo, checkpoint_tables, mapper(params, compute, "features"), TABLES, relabelled)
    distances = []
    for run in (r for r in runs if r.run_dir in planned):
        tasks, failed, layers = planned[run.run_dir]
        fine = [t for t in tasks if t.key not in own.failed and t.key not in failed]
        iterates = run_iterates(run.run_dir, run.out, fine, params)
        distances += distance_tasks(run.out, fine, layers, params, iterates)
    dist = compute_shards(None, distances, distance_tables, mapper(params, compute, "distances"), ("distances",))
    results = {}
    for run in (r for r in runs if r.run_dir in planned):
        tasks, failed, _ = planned[run.run_dir]
        keys = {t.key for t in tasks}
        ckpt_part = _run_part(own, keys, failed)
        results[run.run_dir] = result = ckpt_part.merge(_run_part(dist, keys, {}))
        prune(run.out, [t.key for t in tasks if t.key not in result.failed])
        if len(runs) == 1 or ckpt_part.computed or result.failed:  # renewed distances alone: no line
            progress(_run_line(run, keys, set(ckpt_part.computed), result, time.monotonic() - start))
    _finish(runs, results, missing, time.monotonic() - start, progress)
    return results


def _validation_inputs(corpus_dir: Path, params: FeaturesParams) -> dict:
    """What every checkpoint job shares: the validation tokens, their UTF-8 lengths, and the fingerprint
    parts that do not depend on the checkpoint (the tokens' hash, the params' digest, the code's hash)."""
    tokens = load_tokens(corpus_dir, "val")
    record = read_record(corpus_dir) if (corpus_dir / "source.json").exists() else {}
    return {
        "tokens": tokens,
        "lengths": token_bytes(corpus_dir, record, tokens),
        "batch": hashlib.sha256(tokens.tobytes()).hexdigest()[:16],
        "digest": params_digest(params),
        "code": module_source_hash(__name__),
    }


def _plan_run(run: RunShards, inputs: dict, params: FeaturesParams, progress) -> tuple[list[Task], dict, list[str]]:
    """A run's checkpoint tasks (shards under ``run.out``), ``{key: reason}`` for its damaged checkpoints (changed
    bytes, or another run's sidecar), and its linear layers (from a checkpoint that is its own)."""
    ckpts = list_checkpoints(run.run_dir)
    label = f"features@{run.run_dir.name}"
    if not ckpts:
        why = "no complete checkpoints (step_*.safetensors + .json); run training first"
        raise CheckpointError(f"{run.run_dir}: {why}")
    owner = directory_owner(run.run_dir, ckpts)
    weights, damaged = verified_weights(ckpts, owner, label, progress)
    tasks, failed = [], {}
    for index, ckpt in enumerate(ckpts):
        # a checkpoint not read (changed, another run's) fails in this run's place: the step of its file name
        record, step = (owner, ckpt.file_step) if ckpt.path in damaged else (ckpt.meta, ckpt.step)
        name, variant, seed = record.get("rung") or run.run_dir.name, record.get("variant"), record.get("seed")
        key = ShardKey(str(name), variant or BASE_VARIANT, -1 if seed is None else int(seed), step)
        due = index % params.landscape_every == 0  # in the inputs: a removed checkpoint shifts the others
        # the config too: a change of heads alone keeps the weights' bytes (an initialisation) but not the model
        described = f"weights {weights[ckpt.path]} config {ckpt.config} tokens {inputs['batch']} surface {due}"
        fingerprint = Fingerprint(described, inputs["digest"], inputs["code"])
        job = CheckpointJob(ckpt, key, inputs["tokens"], params, index, inputs["lengths"])
        tasks.append(Task(key, fingerprint, job, run.out))
        if ckpt.path in damaged:
            failed[key] = damaged[ckpt.path]
    layers = linear_layer_names(next((c for c in ckpts if c.path not in damaged), ckpts[0]).config.layers)
    return tasks, failed, layers


def _run_part(run: ShardRun, keys: set[ShardKey], failed: dict) -> ShardRun:
    """The part of a sweep's ``run`` that is one run's (its shard ``keys``), with its damaged checkpoints."""
    return ShardRun(
        [k for k in run.computed if k in keys],
        [k for k in run.reused if k in keys],
        failed | {k: v for k, v in run.failed.items() if k in keys},
        {k: v for k, v in run.damaged.items() if k in keys},
        [k for k in run.copied if k in keys],
    )


def _run_line(run: RunShards, keys: set, computed: set, result: ShardRun, seconds: float) -> str:
    """``features@<run>: N checkpoints, C computed, R already current, F failed, S s -> <out>``."""
    return (
        f"features@{run.run_dir.name}: {len(keys)} checkpoints, {len(computed)} computed, "
        f"{len(keys - computed - set(result.failed))} already current, {len(result.failed)} failed, "
        f"{seconds:.1f} s -> {run.out}{result.damage_note()}"
    )


def _finish(runs: list[RunShards], results: dict, missing: dict, seconds: float, progress) -> None:
    """The sweep's summary line (over several runs), then the one-line error when anything failed."""
    failed = {(path, key): why for path, run in results.items() for key, why in run.failed.items()}
    if len(runs) > 1:
        n = sum(len(set(r.computed) | set(r.reused) | set(r.failed)) for r in results.values())
        copied = sum(len(r.copied) for r in results.values())
        shared = f"; {copied} the same as another run's (equal weights), computed once" if copied else ""
        progress(
            f"features: {len(runs)} runs, {n} checkpoints, {len(failed)} failed, {len(missing)} runs without "
            f"checkpoints, {seconds:.1f} s ({seconds / max(1, len(runs)):.2f} s per run){shared}"
        )
    if missing:
        first, reason = next(iter(missing.items()))
        raise CheckpointError(reason if len(missing) == 1 else f"{len(missing)} runs have no checkpoints: {reason}")
    if failed:
        (path, key), reason = next(iter(failed.items()))
        raise CheckpointError(
            f"features@{path.name}: {len(failed)} checkpoints failed (step {key.step}: {reason}); "
            "the others are written, re-run to retry them"
        )
