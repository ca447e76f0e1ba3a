"""Checkpoints to feature shards through the execution seam (our runs; series: ``topometrics.series.source_shards``).

Every checkpoint's features and diagrams are computed by the one per-checkpoint path
(``topometrics.features.checkpoint`` for our checkpoints, ``topometrics.series.checkpoint`` for external ones) as a job
of :func:`topometrics.execution.compute.each_result` — a local process pool or a Dask cluster, as
``compute`` says — and written as a shard (``topometrics.execution.shards``) as soon as it arrives. A shard
whose fingerprint is current is not computed again. Then each checkpoint's distances to the
previous one (``*_prev``) are a ``distances`` shard, computed from the two diagram shards.
:func:`read_tables` reads the shards back as two tables (tests, benchmarks); the warehouse reads
them with DuckDB.

Fingerprint inputs: our checkpoints, the sha256 of the weights file and of the validation tokens;
hub revisions, ``<model>@<revision>`` (so a cached shard needs no download to be recognised); local
series entries, the sha256 of their files. Both add ``series.seq_len`` and the validation text's hash.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from topometrics.atomic import file_sha256
from topometrics.dynamics.trajectory import NO_SKETCH, Iterates, trajectory_values, window
from topometrics.execution.compute import each_result
from topometrics.execution.shards import (
    Fingerprint,
    ShardKey,
    ShardRun,
    Task,
    compute_shards,
    is_current,
    stored_info,
)
from topometrics.features.checkpoint import (
    DIAGRAM_COLUMNS,
    FEATURE_COLUMNS,
    CheckpointFeatures,
    checkpoint_features,
    diagrams_frame,
    features_frame,
    switched_off,
)
from topometrics.features.distances import distance_features
from topometrics.features.forward import surface_batch, validation_batch
from topometrics.features.gradient_cloud import gradient_batch
from topometrics.models.checkpoints import (
    Checkpoint,
    content_problem,
    foreign_problem,
    load_state,
    safetensors_problem,
)
from topometrics.params import FeaturesParams
from topometrics.params_sources import ComputeParams
from topometrics.training.sketch import read_sketch

TABLES = ("features", "diagrams")


@dataclass(frozen=True)
class CheckpointJob:
    """One of our checkpoints, to its ``features`` and ``diagrams`` tables (a job: it pickles)."""

    ckpt: Checkpoint
    key: ShardKey  # its shard: the rung, seed and step columns
    tokens: np.ndarray  # (n,) uint8 validation tokens; the fixed batch is cut at the checkpoint's context
    params: FeaturesParams
    index: int = 0  # its place among the run's checkpoints (features.landscape_every)
    token_bytes: np.ndarray | None = None  # (vocab,) UTF-8 bytes per id, for batch_bpb (None: unknown)


@dataclass(frozen=True)
class DistanceJob:
    """A checkpoint's ``*_prev`` rows from its diagram shard and the previous checkpoint's (a job: it pickles)."""

    previous: pd.DataFrame | None  # the previous checkpoint's diagram shard; None for the first checkpoint
    current: pd.DataFrame  # this checkpoint's diagram shard
    layers: list[str]  # linear layers in network order: one row per layer and distance, then 'all'
    key: ShardKey
    extra: dict  # the series/revision columns of its feature shard ({} for our runs)
    params: FeaturesParams | None = None  # features.families: distances switched off are NULL with the reason
    iterates: tuple[Iterates | str, Iterates | str] = (NO_SKETCH, "no checkpoint iterates given")  # trajectory


def verified_weights(
    ckpts: list[Checkpoint], owner: dict, label: str, progress: Callable[[str], None]
) -> tuple[dict, dict]:
    """The sha256 of each checkpoint's weights (its shard's fingerprint) by path, checked against its sidecar,
    and ``{path: reason}`` for the checkpoints whose bytes are not those training wrote, or whose sidecar is not
    of the run ``owner`` (:func:`topometrics.training.run_dir.directory_owner`) or of its file name's step: their
    shards are not computed (the train stage recomputes them).

    Checkpoints whose sidecars predate content hashes are read unverified, said in one ``progress`` line
    (the train stage records their hash the next time it checks the run).
    """
    weights, changed = {}, {}
    for ckpt in ckpts:
        weights[ckpt.path] = file_sha256(ckpt.path)
        if problem := foreign_problem(ckpt.path.with_suffix(".json").name, ckpt.meta, ckpt.file_step, owner):
            changed[ckpt.path] = problem  # never read as this run's, nor under its step
        elif problem := content_problem(ckpt.path, ckpt.meta.get("sha256"), weights[ckpt.path]):
            structure = safetensors_problem(ckpt.path)  # truncated says more than a different hash
            problem = f"{ckpt.path.name}: {structure}" if structure else problem
            changed[ckpt.path] = f"{problem}; `dvc repro` recomputes it (the train stage, identically)"
    if unverified := [c.path.name for c in ckpts if "sha256" not in c.meta]:
        why = "written before checkpoints carried one"
        progress(f"{label}: {len(unverified)} checkpoints (e.g. {unverified[0]}) have no sha256 in their sidecars "
                 f"({why}) and are read unverified; `dvc repro -f train` records it")  # fmt: skip
    return weights, changed


def run_iterates(
    run_dir: Path, root: Path, tasks: list[Task], params: FeaturesParams
) -> tuple[Iterates | str, Iterates | str]:
    """A run's two trajectories (``topometrics.dynamics.trajectory``): its sketch and its checkpoints as
    iterates (:func:`shard_iterates` of ``tasks``' shards under ``root``), read only when the ``trajectory``
    family is on; or the reasons there are none."""
    if "trajectory" not in params.families:
        return "off", "off"  # switched_off writes the reason
    steps, points = read_sketch(run_dir)
    sketch = Iterates(steps, points) if steps.size else NO_SKETCH
    return sketch, shard_iterates(root, tasks)


def shard_iterates(root: Path, tasks: list[Task]) -> Iterates | str:
    """The checkpoints of ``tasks`` as trajectory iterates: each one's iterate as its shard under ``root`` keeps
    it (projected once, by the per-checkpoint path, when the shard was computed: no checkpoint is read again),
    in step order; the reason when no shard has one (the ``trajectory`` family was off when they were made)."""
    steps, points = [], []
    for task in sorted(tasks, key=lambda t: t.key.step):
        info = stored_info(task.key.folder(root) / "features.parquet") or {}
        if info.get("iterate") is not None:
            steps.append(task.key.step)
            points.append(info["iterate"])
    if not steps:
        return "no checkpoint iterates in the shards (computed with the trajectory family off)"
    return Iterates(np.asarray(steps, dtype=np.int64), np.asarray(points, dtype=np.float64))


def distance_shards(
    root: Path,
    tasks: list[Task],
    layers: list[str],
    params: FeaturesParams,
    compute: ComputeParams | None,
    iterates: tuple[Iterates | str, Iterates | str] = (NO_SKETCH, "no checkpoint iterates given"),
) -> ShardRun:
    """``distances`` shards: each checkpoint's ``*_prev`` rows against the one before it in ``tasks``, and its
    ``trajectory`` rows from ``iterates`` (the run's sketch, its checkpoints as iterates, or the reasons).

    The fingerprint chains the two checkpoints' fingerprints and the digest of the trailing window's iterates,
    so a recomputed checkpoint also renews its successor's distances. Jobs carry the two diagram tables (read
    here) and the window's iterates.
    """
    tasks = distance_tasks(root, tasks, layers, params, iterates)
    return compute_shards(root, tasks, distance_tables, mapper(params, compute, "distances"), ("distances",))


def distance_tasks(
    root: Path,
    tasks: list[Task],
    layers: list[str],
    params: FeaturesParams,
    iterates: tuple[Iterates | str, Iterates | str] = (NO_SKETCH, "no checkpoint iterates given"),
) -> list[Task]:
    """:func:`distance_shards`' tasks (a job only where the shard is not current), shards under ``root``."""
    jobs, prev = [], None
    for task in tasks:
        before = prev.fingerprint.digest if prev else "none"
        windows = tuple(window(it, task.key.step, params) for it in iterates)
        fingerprint = Fingerprint(
            f"{before} -> {task.fingerprint.digest} iterates {_digest(windows)}",
            task.fingerprint.params,
            task.fingerprint.code,
        )
        job = None
        if not is_current(root, task.key, fingerprint, ("distances",)):
            previous = None if prev is None else read_table(root, prev.key, "diagrams")
            current = read_table(root, task.key, "diagrams")
            job = DistanceJob(previous, current, layers, task.key, _extra(root, task.key), params, windows)
        jobs.append(Task(task.key, fingerprint, job, root))
        prev = task
    return jobs


def read_tables(root: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The feature rows and the diagrams of every shard under ``root``, as two tables in memory.

    Shards in (rung, variant, seed, step) order; each one's ``features`` rows then its ``distances``
    (``*_prev``) rows, as the warehouse loads them, with the series/revision columns of series shards.
    Every shard is read, whatever its fingerprint. None: empty tables of
    :data:`~topometrics.features.checkpoint.FEATURE_COLUMNS` and
    :data:`~topometrics.features.checkpoint.DIAGRAM_COLUMNS`.
    """
    features, diagrams = [], []
    for key in stored_keys(root):
        found = {t: key.folder(root) / f"{t}.parquet" for t in ("features", "distances", "diagrams")}
        found = {t: pd.read_parquet(path) for t, path in found.items() if path.is_file()}
        features += [found[t] for t in ("features", "distances") if t in found]
        diagrams += [found["diagrams"]] if "diagrams" in found else []
    return _concat(features, FEATURE_COLUMNS), _concat(diagrams, DIAGRAM_COLUMNS)


# ---------------------------------------------------------------------------
# Jobs (module level: they run in worker processes)
# ---------------------------------------------------------------------------


def checkpoint_tables(job: CheckpointJob) -> dict:
    batch = validation_batch(job.tokens, job.ckpt.config.context, job.params.rep_batch)
    surface = surface_batch(job.tokens, job.ckpt.config.context, job.params, job.index)
    n_bytes = None if job.token_bytes is None else float(job.token_bytes[batch[1].numpy()].sum())
    gradients = gradient_batch(job.tokens, job.ckpt.config.context, job.params)
    state = load_state(job.ckpt.path)
    result = checkpoint_features(state, job.ckpt.config, batch, job.params, surface, n_bytes, gradients)
    return frames(result, job.key, {})


def distance_tables(job: DistanceJob) -> dict:
    prev = None if job.previous is None else _diagrams(job.previous)
    result = distance_features(prev, _diagrams(job.current), job.layers)
    if job.params is not None:
        for layer, values, reason in trajectory_values(*job.iterates, job.key.step, job.params):
            result.add(layer, values, reason)
    result = result if job.params is None else switched_off(result, job.params)
    return {"distances": features_frame(result, job.key.rung, job.key.seed, job.key.step).assign(**job.extra)}


def relabelled(tables: dict, key: ShardKey) -> dict:
    """:func:`checkpoint_tables`' result as ``key``'s: the same rows under its rung, seed and step (a checkpoint
    of another run with the same fingerprint: its features do not depend on which run holds it; the variant is
    the shard's folder, not a column)."""
    labels = {"rung": key.rung, "seed": key.seed, "step": key.step}
    return tables | {name: tables[name].assign(**labels) for name in TABLES}


def frames(result: CheckpointFeatures, key: ShardKey, extra: dict) -> dict:
    """A checkpoint's shard tables, and its ``info``: the checkpoint's trajectory iterate, when computed."""
    out = {
        "features": features_frame(result, key.rung, key.seed, key.step).assign(**extra),
        "diagrams": diagrams_frame(result, key.rung, key.seed, key.step).assign(**extra),
    }
    if result.iterate is not None:  # JSON keeps a float64 exactly (shortest repr)
        out["info"] = {"iterate": [float(v) for v in result.iterate]}
    return out


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def mapper(params: FeaturesParams, compute: ComputeParams | None, label: str):
    return functools.partial(each_result, workers=params.workers, label=label, compute=compute)


def _digest(windows: tuple[Iterates | str, ...]) -> str:
    """A short sha256 of the iterates (or reasons) a checkpoint's trajectory rows are computed from."""
    h = hashlib.sha256()
    for it in windows:
        h.update(it.encode() if isinstance(it, str) else it.steps.tobytes() + np.ascontiguousarray(it.points).tobytes())
    return h.hexdigest()[:16]


def _diagrams(frame: pd.DataFrame) -> CheckpointFeatures:
    """The diagrams of a diagram shard back as ``{(source, layer): [H0 bars, H1 bars]}`` (finite bars)."""
    out, rows = CheckpointFeatures(), {}
    for i, key in enumerate(zip(frame["source"].tolist(), frame["layer"].tolist(), strict=True)):
        rows.setdefault(key, []).append(i)  # first appearance order, rows in order (a groupby's, 5x faster)
    dims, bars = frame["dim"].to_numpy(), frame[["birth", "death"]].to_numpy(np.float64)
    for key, index in rows.items():
        index = np.asarray(index)
        out.diagrams[key] = [bars[index[dims[index] == dim]] for dim in (0, 1)]
    return out


def read_table(root: Path, key: ShardKey, table: str) -> pd.DataFrame:
    return pd.read_parquet(key.folder(root) / f"{table}.parquet")


def stored_keys(root: Path) -> list[ShardKey]:
    """The keys of the shard folders under ``root``, in (rung, variant, seed, step) order."""
    keys = []
    for folder in Path(root).glob("rung=*/variant=*/seed=*/step=*"):
        rung, variant, seed, step = (part.split("=", 1)[1] for part in folder.relative_to(root).parts)
        keys.append(ShardKey(rung, variant, int(seed), int(step)))
    return sorted(keys, key=lambda k: (k.rung, k.variant, k.seed, k.step))


def _concat(parts: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)


def _extra(root: Path, key: ShardKey) -> dict:
    """The series/revision columns of a checkpoint's feature shard (none for our runs)."""
    frame = pd.read_parquet(key.folder(root) / "features.parquet", columns=None)
    return {c: frame[c].iloc[0] for c in ("series", "revision") if c in frame.columns and len(frame)}
