"""External series to feature shards through the execution seam (``topometrics.features.run_shards``).

Each checkpoint is a job: a hub revision is fetched by the job, on whichever worker runs it, so
a cluster's workers download in parallel and a revision that cannot be fetched there is skipped
with the reason, like an unreadable checkpoint or a lost worker. Shard fingerprints: hub revisions
``<model>@<revision>`` (a cached shard needs no download to be recognised), local entries the
sha256 of their files; both with ``series.seq_len`` and the validation text's hash. A live
monitor's log folder is read as computed (its rows are the monitor's, not shards).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from topometrics.atomic import file_sha256
from topometrics.dynamics.trajectory import SERIES_SKETCH
from topometrics.execution import cost, shards
from topometrics.features.checkpoint import FEATURE_COLUMNS
from topometrics.features.run_shards import TABLES, distance_shards, frames, mapper, read_table, shard_iterates
from topometrics.landscape.surface import spilled_vectors
from topometrics.landscape.vectors import scratch_space
from topometrics.models.architectures import LAYERS_FIX
from topometrics.models.checkpoints import CheckpointError
from topometrics.models.model import device_kind, free_gpu_bytes
from topometrics.params import BASE_VARIANT, FeaturesParams
from topometrics.params_sources import ComputeParams, SeriesParams, SeriesSource
from topometrics.series.checkpoint import SHAPE_ATTRIBUTES, checkpoint_shape, series_checkpoint_features
from topometrics.series.hub import hub_checkpoints, revision_steps, skip_record, weights_sha256
from topometrics.series.run_folders import RunCheckpoint, RunFolderError, scan_run_folder, unreadable
from topometrics.series.safetensors_reader import SafetensorsFile
from topometrics.training.monitor_log import read_log, read_stop

CHECKPOINT_COLUMNS = ["rung", "seed", "step", "val_loss", "train_loss", "reason"]  # the warehouse's checkpoints
RUNG_COLUMNS = ["rung", "kind", "n_params", *SHAPE_ATTRIBUTES]  # the warehouse's rungs


@dataclass
class SeriesShards:
    """What the series stage writes besides the shards."""

    # {"series": [{name, model, path, log, seed, computed, skipped, checkpoints: [...]}]}: a function of the inputs
    # only; a checkpoint whose shard was current is 'computed' too, so a clone that pulled the shards writes the
    # same bytes (what this run computed and what it reused is in ``reused``, for the console).
    status: dict
    logged: pd.DataFrame  # feature rows of monitor logs (computed by the monitor; not shards)
    losses: pd.DataFrame  # CHECKPOINT_COLUMNS: losses of run folders and monitor logs at their available steps
    reused: dict = field(default_factory=dict)  # series name -> checkpoints whose current shard this run reused
    # RUNG_COLUMNS, a row per series with a computed checkpoint: its model's shape (tensors held, config.json's)
    shapes: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=RUNG_COLUMNS))


@dataclass(frozen=True)
class SeriesSettings:
    """What every checkpoint job of one series source shares (bound once per source)."""

    model: str | None  # hub id: each job fetches its revision; None for a run folder
    cache_dir: Path | None  # Hugging Face hub cache (None: the default, HF_HOME / HF_HUB_CACHE)
    text: str  # validation text, tokenised by each checkpoint's own tokenizer
    params: FeaturesParams
    seq_len: int  # tokens per validation window
    layers: Mapping[str, str] | None  # the source's layers option (canonical part -> tensor-name regex)
    label: str  # the series column of its rows: the hub id or the folder


@dataclass(frozen=True)
class SeriesJob:
    """One checkpoint of a series source, to its tables (a job: it pickles)."""

    settings: SeriesSettings
    key: shards.ShardKey
    revision: str  # hub revision, or the entry's name in the run folder
    where: RunCheckpoint | None  # a run folder's checkpoint; None: a hub revision, fetched by the job
    index: int = 0  # its place in the series (features.landscape_every)


@dataclass
class LogSeries:
    """A monitor log folder read as a series: its rows, losses and status checkpoints."""

    features: list[pd.DataFrame] = field(default_factory=list)
    losses: list[pd.DataFrame] = field(default_factory=list)  # CHECKPOINT_COLUMNS rows of measured steps
    status: list[dict] = field(default_factory=list)


def series_shards(
    series: SeriesParams,
    params: FeaturesParams,
    text: str,
    out: Path,
    *,
    compute: ComputeParams | None = None,
    cache_dir: Path | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> SeriesShards:
    """Shards of every configured hub or run-folder series under ``out``, the rows of monitor logs, and the status.

    A hub revision is fetched by the job, on whichever worker runs it: one that cannot be fetched
    there, an unreadable checkpoint, one no architecture rule maps, or a worker lost on it is
    *skipped* with the reason, as is a revision without a step in its name. Distances are to the
    previous available checkpoint. Each status checkpoint has ``revision, step, status ('computed'
    | 'skipped'), reason`` and, with a shard, ``seconds, files, weights_sha256, duplicate_of``.
    The tables: :func:`topometrics.features.run_shards.read_tables` of ``out``.
    """
    code, digest = shards.module_source_hash(__name__), shards.params_digest(params)
    context = f"seq_len {series.seq_len} text {hashlib.sha256(text.encode()).hexdigest()[:16]}"
    status, keep, logged, losses, reused, shapes = [], [], [], [], {}, []
    for name, source in series.sources.items():
        header = {"name": name, "model": source.model, "path": source.path, "log": source.log, "seed": source.seed}
        if source.log is not None:  # already computed by the monitor: read, not computed
            result = log_series(name, source, progress)
            logged += result.features
            losses += result.losses
            counts = {s: sum(c["status"] == s for c in result.status) for s in ("computed", "skipped")}
            status.append(header | counts | {"checkpoints": result.status})
            continue
        label = source.model or str(source.path)
        checkpoints = list(_series_checkpoints(source))
        source_params, too_big = affordable(name, checkpoints, params, progress)
        if too_big is not None:  # not even one layer fits: every checkpoint skipped, nothing allocated
            records = [c if isinstance(c, dict) else skip_record(c[0], c[1], too_big) for c in checkpoints]
            status.append(header | {"computed": 0, "reused": 0, "skipped": len(records), "checkpoints": records})
            continue
        source_digest = shards.params_digest(source_params) if source_params is not params else digest
        settings = SeriesSettings(source.model, cache_dir, text, source_params, series.seq_len, source.layers, label)
        tasks, records, found = [], [], {}
        for ckpt in checkpoints:
            if isinstance(ckpt, dict):
                records.append(ckpt)
                continue
            revision, step, where = ckpt
            try:
                inputs = f"{source.model}@{revision}" if source.model else f"weights {file_sha256(*where.weights)}"
            except OSError as err:  # weights the system refuses to read: this checkpoint alone is skipped
                records.append(skip_record(revision, step, unreadable(where.weights[0], err)))
                continue
            key = shards.ShardKey(name, BASE_VARIANT, source.seed, step)
            job = SeriesJob(settings, key, revision, where, len(tasks))
            due = job.index % params.landscape_every == 0  # features.landscape_every picks by place
            fingerprint = shards.Fingerprint(f"{inputs} {context} surface {due}", source_digest, code)
            tasks.append(shards.Task(key, fingerprint, job))
            found[key] = (revision, where)
        run = shards.compute_shards(out, tasks, _series_tables, mapper(params, compute, f"series {name}"), TABLES)
        available = [t for t in tasks if t.key not in run.failed]
        on = "trajectory" in params.families  # a series' trajectory: its checkpoints, as their shards keep them
        iterates = (SERIES_SKETCH, shard_iterates(out, available)) if on else ("off", "off")
        run = run.merge(distance_shards(out, available, _layers(out, available), params, compute, iterates))
        keep += [t.key for t in tasks if t.key not in run.failed]
        losses += [_losses(name, source.seed, where) for key, (_, where) in found.items() if key not in run.failed]
        computed, shape = _records(out, run, tasks, {key: revision for key, (revision, _) in found.items()})
        records += computed
        if shape is not None:
            shapes.append({"rung": name, "kind": "series", **shape})
        if run.damaged:
            progress(f"{name}:{run.damage_note()[1:]}")
        records.sort(key=lambda r: (r["step"] is None, r["step"] or 0))
        for line in grouped_lines(name, records):  # a line per status and reason, not per checkpoint
            progress(line)
        reused[name] = sum(r["status"] == "reused" for r in records)
        records = [r | {"status": "computed"} if r["status"] == "reused" else r for r in records]
        counts = {s: sum(r["status"] == s for r in records) for s in ("computed", "skipped")}
        status.append(header | counts | {"checkpoints": records})
    shards.prune(out, keep)
    loss_rows = [part for part in losses if part is not None and len(part)]
    frame = pd.concat(loss_rows, ignore_index=True) if loss_rows else pd.DataFrame(columns=CHECKPOINT_COLUMNS)
    types = {"seed": "int64", "step": "int64", "val_loss": "float64", "train_loss": "float64", "reason": "object"}
    rows = pd.concat(logged, ignore_index=True) if logged else pd.DataFrame(columns=FEATURE_COLUMNS + ["series"])
    rows = rows.astype({"seed": "int64", "step": "int64", "value": "float64"})
    shape_frame = pd.DataFrame(shapes, columns=RUNG_COLUMNS).astype({c: "Int64" for c in RUNG_COLUMNS[2:]})
    return SeriesShards({"series": status}, rows, frame[CHECKPOINT_COLUMNS].astype(types), reused, shape_frame)


def affordable(
    name: str,
    checkpoints: list,
    params: FeaturesParams,
    progress: Callable[[str], None],
    available: int | None = None,
    gpu_available: int | None = None,
    scratch: tuple[str, int] | None = None,
) -> tuple[FeaturesParams, str | None]:
    """``(params, None)`` with the families this machine's memory cannot hold taken out (said in one line each,
    with the GB they need), after the estimate's line; ``(params, reason)`` when not even the largest tensor of
    a checkpoint fits. The model's shape is read from the first local checkpoint's safetensors headers (a hub
    revision is fetched by its job: no estimate before). ``available`` / ``gpu_available``: free host and GPU
    bytes (default: the machine's; the GPU's only when ``features.device`` sends the model there); ``scratch``:
    the folder a large model's loss-surface vectors go to and the bytes free there (default: ``TMPDIR``'s)."""
    first = next((c[2] for c in checkpoints if not isinstance(c, dict) and c[2] is not None), None)
    if first is None:
        return params, None
    sizes = [math.prod(t["shape"]) for path in first.weights for t in SafetensorsFile(path).header.values()]
    available = cost.available_bytes() if available is None else available
    if why := cost.one_layer_line(max(sizes, default=0), available):
        progress(f"{name}: skipped: {why}")
        return params, why
    spilled = spilled_vectors(sum(sizes), params.hessian_iters, params.hessian_top)
    costs = cost.checkpoint_costs(
        sum(sizes), params.families, probes=(params.hessian_probes, params.hessian_probes_max), spilled=spilled
    )
    count = sum(not isinstance(c, dict) for c in checkpoints)
    device = device_kind(params.device)  # no raise here: pick_device checks CUDA where the model runs
    progress(f"{name}: {cost.plan_line(sum(sizes), costs, count, params.landscape_every, device)}")
    gpu_available = free_gpu_bytes(device) if gpu_available is None else gpu_available
    too_big = cost.unaffordable(costs, available, gpu_available, scratch_space() if scratch is None else scratch)
    for family, why in too_big.items():
        progress(f"{name}: {family} skipped on every checkpoint: {why}")
    if not too_big:
        return params, None
    kept = tuple(f for f in params.families if f not in cost.skipped_families(params.families, too_big))
    return dataclasses.replace(params, families=kept), None


def grouped_lines(name: str, records: list[dict]) -> list[str]:
    """'<name>: <n> computed' and '<name>: <n> skipped: <reason>' per distinct reason, the checkpoint's own name
    in a reason written ``<checkpoint>`` so that the reasons of many checkpoints read as one (each checkpoint's
    own is in status.json)."""
    counts: dict[tuple[str, str | None], int] = {}
    for r in records:
        if r["status"] == "reused":
            continue
        reason = r["reason"].replace(r["revision"], "<checkpoint>") if r["reason"] and r["revision"] else r["reason"]
        counts[(r["status"], reason)] = counts.get((r["status"], reason), 0) + 1
    return [f"{name}: {n} {status}" + (f": {reason}" if reason else "") for (status, reason), n in counts.items()]


def summary_line(series: dict, reused: int = 0) -> str:
    """The stage's line for one series of status.json (``reused`` of its computed checkpoints had a current shard):
    its counts and, when checkpoints were skipped, the advice that fits the source and the reasons (a hub revision
    waits for the hub or cache; a folder needs a fix)."""
    counts = f"{series['computed'] - reused} computed, {reused} reused, {series['skipped']} skipped"
    text = f"series {series['name']}: {counts}"
    if not series["skipped"]:
        return text
    reasons = [c["reason"] or "" for c in series["checkpoints"] if c["status"] == "skipped"]
    hints = [hint for words, hint in _ADVICE if any(w in r for r in reasons for w in words)]
    if series.get("model") and not hints:  # a hub revision: fetched on a later run once the hub or cache has it
        hints.append("rerun `dvc repro` when the hub or cache has them")
    return f"{text} (see status.json; {'; '.join(hints or ['each checkpoint has its reason there'])})"


# Skip reasons (their words) -> what fixes them, for a folder as for a hub model.
_ADVICE = (
    (("unknown architecture", "incomplete blocks"), LAYERS_FIX),
    (("matches no 2-D tensor", "not a canonical part", "is not a regular expression", "needs exactly one group"),
     "fix the source's `layers:` option (docs/series.md, Any decoder)"),
    (("pickle weights are never opened",), "convert the pickle files with the command in the reason"),
)  # fmt: skip


def log_series(name: str, source: SeriesSource, progress: Callable[[str], None] = lambda line: None) -> LogSeries:
    """A live monitor's log folder as a series: its complete files, as computed (``topometrics.training.monitor_log``).

    The rows keep their values; ``rung``/``seed`` become the series name and seed. Every measured
    step is a computed checkpoint; a folder with no complete file is one skip; an early stop
    (``stop.json``) is in the status of its step.
    """
    folder = Path(source.log)
    try:
        features, losses = read_log(folder) if folder.is_dir() else (pd.DataFrame(), pd.DataFrame())
        stop = read_stop(folder) if folder.is_dir() else {}
    except (OSError, ValueError, RecursionError) as err:  # a damaged Parquet or JSON file: ValueErrors both
        features, losses, stop = pd.DataFrame(), pd.DataFrame(), {"unreadable": f"{type(err).__name__}: {err}"}
    if features.empty or "unreadable" in stop:
        why = stop.get("unreadable", "no features-<step>.parquet files (is it a TopologyMonitor log folder?)")
        reason = f"{folder}: {why}".splitlines()[0]
        progress(f"{name}: skipped: {reason}")
        return LogSeries(status=[skip_record(folder.name, None, reason)])
    extra = {"series": str(folder), "revision": "live"}
    result = LogSeries(features=[features.assign(rung=name, seed=source.seed, **extra)])
    for step in sorted(features["step"].unique()):
        note = stop.get("reason") if stop.get("step") == step else None
        result.status.append({"revision": f"live step {step}", "step": int(step), "status": "computed", "reason": note})
    measured = losses[losses["step"].isin(features["step"])]
    missing = measured[["val_loss", "train_loss"]].isna().any(axis=1)
    reason = np.where(missing, "not logged at this step (TopologyMonitor.record_losses)", None)
    result.losses.append(measured.assign(rung=name, seed=source.seed, reason=reason)[CHECKPOINT_COLUMNS])
    progress(f"{name}: {len(result.status)} live measurements from {folder}")
    return result


def _losses(name: str, seed: int, where) -> pd.DataFrame | None:
    """A run folder checkpoint's logged losses as a ``checkpoints`` row (hub revisions have none)."""
    if not isinstance(where, RunCheckpoint):
        return None
    row = (name, seed, where.step, where.val_loss, where.train_loss, where.loss_reason)
    return pd.DataFrame([row], columns=CHECKPOINT_COLUMNS)


def _series_tables(job: SeriesJob) -> dict:
    settings, where = job.settings, job.where
    start = time.perf_counter()
    if settings.model is not None:  # fetched here, on the worker
        where = next(hub_checkpoints(settings.model, (job.revision,), settings.cache_dir))
        if isinstance(where, dict):
            raise CheckpointError(where["reason"])
    result, _ = series_checkpoint_features(
        where, settings.text, settings.params, settings.seq_len, settings.layers, job.index
    )
    out = frames(result, job.key, {"series": settings.label, "revision": job.revision})
    files = [str(p) for p in where.weights]
    out["info"] = out.get("info", {}) | {
        "seconds": round(time.perf_counter() - start, 3),
        "files": files,
        "weights_sha256": weights_sha256(where.weights),
        "shape": checkpoint_shape(where),
    }
    return out


def _series_checkpoints(source):
    """(revision, step, RunCheckpoint or None for hub revisions) or skip records, in step order."""
    if source.model is None:
        try:
            folder = scan_run_folder(Path(source.path), Path(source.losses) if source.losses else None)
        except RunFolderError as err:
            yield skip_record(source.path, None, str(err))
            return
        except OSError as err:  # the losses file or the folder refused by the system
            yield skip_record(source.path, None, unreadable(Path(err.filename or source.path), err))
            return
        yield from folder.skipped
        for ckpt in folder.checkpoints:
            yield ckpt.revision, ckpt.step, ckpt
        return
    steps, skips = revision_steps(source.revisions)
    yield from skips
    for revision, step in steps.items():
        yield revision, step, None


def _layers(root: Path, tasks: list[shards.Task]) -> list[str]:
    if not tasks:
        return []
    frame = read_table(root, tasks[0].key, "features")
    return [layer for layer in dict.fromkeys(frame["layer"]) if layer != "all"]


def _records(
    root: Path, run: shards.ShardRun, tasks: list[shards.Task], revision_of: dict
) -> tuple[list[dict], dict | None]:
    """The status record of every task, and the model's shape as the first shard that has one records it."""
    records, first_of, found_shape = [], {}, None
    for task in tasks:
        revision = revision_of[task.key]
        if task.key in run.failed:
            records.append(skip_record(revision, task.key.step, run.failed[task.key]))
            continue
        info = shards.stored_info(task.key.folder(root) / "features.parquet") or {}
        info.pop("iterate", None)  # the trajectory's iterate: data for the distances, not status
        shape = info.pop("shape", None)  # the model's, the same at every checkpoint: the rungs table's
        blob = info.get("weights_sha256")
        status = "reused" if task.key in run.reused else "computed"
        records.append({"revision": revision, "step": task.key.step, "status": status, "reason": None, **info,
                        "duplicate_of": first_of.get(blob)})  # fmt: skip
        found_shape = found_shape or shape
        if blob is not None:
            first_of.setdefault(blob, revision)
    return records, found_shape
