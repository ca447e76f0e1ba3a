"""Training-run folders as checkpoint series: what checkpoints a folder holds, and their losses.

Two layouts are read (``docs/series.md``):

- **Hugging Face Trainer output**: ``checkpoint-<step>/`` folders with ``model.safetensors`` (or
  shards and ``model.safetensors.index.json``), ``config.json`` and ``trainer_state.json``. The
  train and eval loss at a checkpoint are the ``log_history`` entries logged at its step
  (``loss``, ``eval_loss``).
- **Plain safetensors state dicts**: ``step_<n>.safetensors``, ``step<n>.safetensors`` or
  ``<anything>-<n>.safetensors`` (also ``_<n>``) directly in the folder, with the folder's
  ``config.json`` (or a ``layers:`` mapping in params), and optionally a CSV or JSONL file of
  losses by step (columns ``step`` and ``val_loss``/``eval_loss`` and/or ``train_loss``/``loss``).
  Our own checkpoints qualify: their ``<entry>.json`` sidecars give the step and both losses.

Pickle files (``*.bin``, ``*.pt``, ``*.pth``, ``*.ckpt``, ``*.pkl``) are never opened. A
checkpoint stored only as pickle is recorded as skipped with the command that converts it; the
Trainer's own pickles beside safetensors weights (``optimizer.pt``, ``rng_state.pth``,
``training_args.bin``) are not weights and are ignored. Checkpoints whose 2-D tensors (names and
shapes) differ from the folder's most common set are skipped: one series is one architecture.

A folder is read as a stranger's: only regular files are opened (a FIFO would block the stage
forever), every JSON file is bounded in size (:data:`MAX_JSON_BYTES`) and depth, every step is an
integer below 2**31 (:data:`MAX_STEP`) and every loss a finite number, and a safetensors file's tensors are bounded
before anything is read (:meth:`topometrics.series.safetensors_reader.SafetensorsFile.size_problem`).
Whatever fails is a skip with its reason, never an exception that stops the other checkpoints.

Why over 400 lines: most of it is the defensive reading above (a stranger's folder: bounded JSON, regular
files only, pickles refused with the conversion, one architecture), each check a few lines; one idea, a folder
read as checkpoints.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from topometrics.models.checkpoints import CheckpointError
from topometrics.series.safetensors_reader import SafetensorsFile

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
# Pickles the Trainer writes beside the weights of every checkpoint; not weights, never read.
TRAINER_PICKLES = ("optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin", "scaler.pt")
_STEP_NAMES = (
    re.compile(r"(?:^|[-_.])(?:step|checkpoint|ckpt|iter)[-_]?(\d+)$", re.IGNORECASE),
    re.compile(r"[-_](\d+)$"),  # <anything>-<n>, <anything>_<n>
)
# A name ending in a signed number (checkpoint--5, step_-1) is no step: never read as 5 or 1 (displacing step_1).
_SIGNED_STEP = re.compile(r"[-_][-+]\d+$")
_SHARD = re.compile(r"-\d{5}-of-\d{5}$")
_VAL_NAMES, _TRAIN_NAMES = ("val_loss", "eval_loss", "valid_loss"), ("train_loss", "loss")
MAX_JSON_BYTES = 64 * 2**20  # a trainer_state.json logging every step of a million-step run is ~150 MB; ours are KB
MAX_STEP = 2**31  # steps are below it: the warehouse's step column is a 32-bit INTEGER (JSON and Parquet hold more)
BEYOND_STEPS = "is beyond the warehouse's 32-bit step column (at most 2**31-1)"
# map_location: a file saved from CUDA loads on a machine without it; clone: save_file refuses tensors that share
# memory (a head tied to the embedding) and non-contiguous ones.
CONVERT = (
    'convert it once, where you trust the file: python -c "import torch; from safetensors.torch import save_file; '
    "sd = torch.load('{path}', map_location='cpu', weights_only=True); "
    "save_file({{k: v.contiguous().clone() for k, v in sd.items()}}, '{target}')\""
)


class RunFolderError(ValueError):
    """A run folder or its losses file cannot be read; the message names the file and the fix."""


@dataclass(frozen=True)
class RunCheckpoint:
    """One checkpoint of a run folder, resolved to files, with the losses logged at its step."""

    step: int
    revision: str  # the entry's name in the folder (checkpoint-500, step_000100.safetensors)
    weights: tuple[Path, ...]  # safetensors files (shards) holding the state dict
    config_dir: Path | None  # folder with config.json (None: weight features through a layers: mapping)
    tokenizer_dir: Path | None  # folder with the model's own tokenizer files
    val_loss: float | None = None
    train_loss: float | None = None
    loss_reason: str | None = None  # why a loss is NULL


@dataclass
class RunFolder:
    """A folder's checkpoints in step order and the entries skipped, each ``{revision, step, status, reason}``."""

    checkpoints: list[RunCheckpoint] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)

    def losses(self) -> pd.DataFrame:
        """``(step, val_loss, train_loss, reason)`` per checkpoint: the series' ``checkpoints`` rows."""
        rows = [(c.step, c.val_loss, c.train_loss, c.loss_reason) for c in self.checkpoints]
        frame = pd.DataFrame(rows, columns=["step", "val_loss", "train_loss", "reason"])
        return frame.astype({"step": "int64", "val_loss": "float64", "train_loss": "float64", "reason": "object"})


def scan_run_folder(folder: Path, losses_file: Path | None = None) -> RunFolder:
    """The checkpoints of a run folder (Trainer output or plain safetensors files), in step order.

    Parameters
    ----------
    folder : Path
        The run folder.
    losses_file : Path, optional
        CSV or JSONL of losses by step; without it, Trainer checkpoints read ``trainer_state.json``
        and plain files their ``<entry>.json`` sidecars. Raises :class:`RunFolderError` when it
        cannot be read.

    Returns
    -------
    RunFolder
        Unusable entries (no step, pickle only, a different architecture, a repeated step,
        unreadable) are in ``skipped`` with the reason; a folder with no checkpoints at all gives
        one skip saying so. Never raises for a bad checkpoint.
    """
    folder = Path(folder)
    result = RunFolder()
    try:
        entries = sorted(folder.iterdir()) if folder.is_dir() else None
    except OSError as err:  # a folder that cannot be listed (permissions, /proc): this source is one skip
        result.skipped.append(_skip(str(folder), None, unreadable(folder, err)))
        return result
    if entries is None:
        result.skipped.append(_skip(str(folder), None, f"{folder}: not a directory; check the series path"))
        return result
    table = read_losses(Path(losses_file)) if losses_file is not None else None
    found = []
    for entry in entries:
        try:
            item = _entry(entry, folder, table)
        except OSError as err:  # one entry that cannot be stat'ed or listed (a colleague's file): it alone is skipped
            item = _skip(entry.name, None, unreadable(entry, err))
        if isinstance(item, dict):
            result.skipped.append(item)
        elif item is not None:
            found.append(item)
    found, mixed = _one_architecture(found)
    result.skipped += mixed
    seen = {}
    for ckpt in sorted(found, key=lambda c: (c.step, c.revision)):
        if ckpt.step in seen:
            result.skipped.append(
                _skip(ckpt.revision, ckpt.step, f"step {ckpt.step} already given by {seen[ckpt.step]}")
            )
            continue
        seen[ckpt.step] = ckpt.revision
        result.checkpoints.append(ckpt)
    if not result.checkpoints and not result.skipped:
        reason = f"{folder}: no checkpoints (checkpoint-<step>/ folders or <name>-<step>.safetensors files)"
        result.skipped.append(_skip(folder.name, None, reason))
    return result


def _entry(entry: Path, folder: Path, table: pd.DataFrame | None) -> RunCheckpoint | dict | None:
    """One folder entry as a checkpoint, a skip record, or None (not a checkpoint: configs, logs).
    Raises OSError when the entry cannot be stat'ed or listed."""
    if _SIGNED_STEP.search(entry.name.removesuffix(".safetensors")):
        reason = f"{entry}: a step name ends in a plain non-negative integer (step_1, checkpoint-5); rename it"
        return _skip(entry.name, None, reason)
    if entry.is_dir():
        weights = _folder_weights(entry)
        if not weights:
            pickles = [p for p in sorted(entry.iterdir()) if _is_pickle_weights(p)]
            if pickles:
                step = _storable(step_from_name(entry.name))
                return _pickle_skip(entry.name, step, pickles[0], entry / "model.safetensors")
            return None
        if odd := next((p for p in weights if not p.is_file()), None):
            return _skip(entry.name, _storable(step_from_name(entry.name)), _not_regular(odd))
        step = step_from_name(entry.name)
        step = step if step is not None else _json_step(entry / "trainer_state.json", "global_step")
        if isinstance(step, str):
            return _skip(entry.name, None, step)
        if step is None:
            return _skip(entry.name, None, f"{entry}: cannot tell the step; name it checkpoint-<step>")
        if step >= MAX_STEP:
            return _skip(entry.name, None, _too_large(entry, step))
        losses = (
            trainer_losses(entry / "trainer_state.json", step, folder / "trainer_state.json")
            if table is None
            else table_losses(table, step)
        )
        config = _dir_with(entry, folder, "config.json")
        return RunCheckpoint(step, entry.name, weights, config, _tokenizer(entry, folder), *losses)
    if entry.suffix in PICKLE_SUFFIXES and _is_pickle_weights(entry):
        return _pickle_skip(entry.name, _storable(step_from_name(entry.stem)), entry, entry.with_suffix(".safetensors"))
    if entry.suffix != ".safetensors":
        return None
    if not entry.is_file():
        return _skip(entry.name, _storable(step_from_name(entry.stem)), _not_regular(entry))
    if _SHARD.search(entry.stem):
        return _skip(
            entry.name, None, f"{entry}: a shard of a sharded checkpoint; put each checkpoint's shards in a folder"
        )
    sidecar = entry.with_suffix(".json")
    step = step_from_name(entry.stem)
    step = step if step is not None else _json_step(sidecar, "step")
    if isinstance(step, str):
        return _skip(entry.name, None, step)
    if step is None:
        return _skip(entry.name, None, f"{entry}: cannot tell the step; name it step_<n>.safetensors or <name>-<n>")
    if step >= MAX_STEP:
        return _skip(entry.name, None, _too_large(entry, step))
    losses = _sidecar_losses(sidecar) if table is None else table_losses(table, step)
    config = _dir_with(folder, folder, "config.json")
    return RunCheckpoint(step, entry.name, (entry,), config, _tokenizer(folder, folder), *losses)


def step_from_name(name: str) -> int | None:
    """The step in ``checkpoint-500``, ``step_000100``, ``step100``, ``run-a-300`` or ``model_7`` (None if absent;
    any size: :data:`MAX_STEP` bounds what is read)."""
    for pattern in _STEP_NAMES:
        match = pattern.search(name)
        if match:
            return int(match.group(1))
    return None


def _storable(step: int | None) -> int | None:
    """``step`` when the warehouse can hold it, else None (a skip record keeps no step it cannot store)."""
    return step if step is not None and step < MAX_STEP else None


def _too_large(entry: Path, step: int) -> str:
    return f"{entry}: step {step:,} {BEYOND_STEPS}; renumber it"


# ---------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------


def trainer_losses(
    state: Path, step: int, fallback: Path | None = None
) -> tuple[float | None, float | None, str | None]:
    """``(val_loss, train_loss, reason)`` at ``step`` from a Trainer's ``trainer_state.json``.

    ``log_history`` entries with ``"step": step`` give ``eval_loss`` and ``loss``. A checkpoint's
    own file is read, else ``fallback`` (the run folder's, written at the end of training). A
    missing or malformed file, or no loss logged at that step, gives None with the reason.
    """
    path = state if state.is_file() else fallback if fallback is not None and fallback.is_file() else None
    if path is None:
        return None, None, f"no trainer_state.json in {state.parent.name} or the run folder"
    record, problem = read_json(path, "trainer_state.json")
    history = record.get("log_history") if isinstance(record, dict) else None
    if problem or not isinstance(history, list):
        return None, None, problem or f"{path}: malformed trainer_state.json (no log_history list)"
    logged = [h for h in history if isinstance(h, dict) and h.get("step") == step]
    val = next((v for h in logged if (v := finite_number(h.get("eval_loss"))) is not None), None)
    train = next((v for h in logged if (v := finite_number(h.get("loss"))) is not None), None)
    missing = [name for name, value in (("eval_loss", val), ("loss", train)) if value is None]
    reason = None
    if missing:
        hint = "make logging_steps and eval_steps divide save_steps"
        reason = f"{path.name} logs no {' or '.join(missing)} at step {step} ({hint})"
    return val, train, reason


def read_losses(path: Path) -> pd.DataFrame:
    """A losses file (``.csv`` or ``.jsonl``) as ``(step, val_loss, train_loss)``, one row per step.

    Column names ``val_loss``/``eval_loss``/``valid_loss`` and ``train_loss``/``loss`` are accepted;
    at least one of the two must be there. Raises :class:`RunFolderError` naming the file.
    """
    if not path.is_file():
        raise RunFolderError(f"{path}: not a regular file; give a CSV or JSONL file of losses by step")
    try:
        frame = pd.read_json(path, lines=True) if path.suffix == ".jsonl" else pd.read_csv(path)
    except (OSError, ValueError, RecursionError) as err:
        raise RunFolderError(
            f"{path}: cannot read the losses file ({err}); give a CSV or JSONL with a step column"
        ) from err
    val = next((c for c in _VAL_NAMES if c in frame.columns), None)
    train = next((c for c in _TRAIN_NAMES if c in frame.columns), None)
    if "step" not in frame.columns or (val is None and train is None):
        raise RunFolderError(f"{path}: needs a step column and val_loss (or eval_loss) and/or train_loss (or loss)")
    steps = pd.to_numeric(frame["step"], errors="coerce")
    bad = ~(steps.between(0, MAX_STEP - 1) & (steps % 1 == 0))
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise RunFolderError(
            f"{path}: step {frame['step'].iloc[row]!r} (row {row + 1}) is not an integer from 0 to 2**31-1; "
            "fix that row of the losses file"
        )
    out = pd.DataFrame({"step": steps.astype("int64")})
    for column, name in (("val_loss", val), ("train_loss", train)):  # a non-numeric loss is a missing one
        out[column] = pd.to_numeric(frame[name], errors="coerce").astype("float64") if name else np.nan
    # JSONL logs often write train and eval rows separately: one row per step, first value of each.
    return out.groupby("step", as_index=False).first()


def table_losses(table: pd.DataFrame, step: int) -> tuple[float | None, float | None, str | None]:
    rows = table[table["step"] == step]
    if rows.empty:
        return None, None, f"the losses file has no row for step {step}"
    val, train = (finite_number(rows[c].iloc[0]) for c in ("val_loss", "train_loss"))
    missing = [name for name, value in (("val_loss", val), ("train_loss", train)) if value is None]
    return val, train, f"the losses file has no {' or '.join(missing)} at step {step}" if missing else None


def _sidecar_losses(sidecar: Path) -> tuple[float | None, float | None, str | None]:
    if not sidecar.is_file():
        return None, None, "no losses: give the series a losses file (CSV/JSONL by step)"
    meta, problem = read_json(sidecar)
    if problem or not isinstance(meta, dict):
        return None, None, problem or f"{sidecar}: not a JSON object"
    val, train = finite_number(meta.get("val_loss")), finite_number(meta.get("train_loss"))
    return val, train, None if val is not None and train is not None else f"{sidecar.name} has no val_loss/train_loss"


def finite_number(value) -> float | None:
    """``value`` as a float when it is a finite number (not a bool, a string or None), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        return None
    return float(value) if np.isfinite(float(value)) else None


def read_json(path: Path, kind: str = "JSON", limit: int = MAX_JSON_BYTES) -> tuple[object, str | None]:
    """The JSON value of a regular file of at most ``limit`` bytes, and None; or None and why not
    (too large, nested deeper than Python's parser allows, not JSON, not UTF-8, not a regular file)."""
    if not path.is_file():
        return None, _not_regular(path) if path.exists() else f"{path}: missing"
    if (size := path.stat().st_size) > limit:
        return None, f"{path}: {size:,} bytes, more than the {limit:,} a JSON file here may hold"
    try:
        return json.loads(path.read_bytes()), None
    except RecursionError:
        return None, f"{path}: nested deeper than a JSON file here may be"
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        return None, f"{path}: malformed {kind} ({type(err).__name__}: {err})"


# ---------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------


def _folder_weights(entry: Path) -> tuple[Path, ...]:
    return tuple(sorted(entry.glob("*.safetensors")))


def unreadable(path: Path, err: OSError) -> str:
    """Why ``path`` is skipped when the system refuses to stat, list or read it, and the fix."""
    why = err.strerror or type(err).__name__
    return f"{path}: cannot be read ({why}); make it readable or move it out of the series folder"


def _not_regular(path: Path) -> str:
    return f"{path}: not a regular file (a FIFO, socket or device; it could block the stage forever): never read"


def _is_pickle_weights(path: Path) -> bool:
    return path.is_file() and path.suffix in PICKLE_SUFFIXES and path.name not in TRAINER_PICKLES


def _pickle_skip(revision: str, step: int | None, path: Path, target: Path) -> dict:
    reason = f"{path}: pickle weights are never opened; " + CONVERT.format(path=path, target=target)
    return _skip(revision, step, reason)


def _one_architecture(found: list[RunCheckpoint]) -> tuple[list[RunCheckpoint], list[dict]]:
    """Keep the checkpoints whose 2-D tensors (names, shapes) are the folder's most common set."""
    signatures, skipped = {}, []
    for ckpt in found:
        try:
            signatures[ckpt.revision] = _signature(ckpt.weights)
        except CheckpointError as err:  # SafetensorsFile's errors start with the file
            skipped.append(_skip(ckpt.revision, ckpt.step, str(err)))
        except OSError as err:
            skipped.append(_skip(ckpt.revision, ckpt.step, unreadable(ckpt.weights[0], err)))
    counts = Counter(signatures.values())
    if not counts:
        return [], skipped
    # the most common architecture; on a tie, that of the earliest step
    best = max(counts, key=lambda s: (counts[s], -min(c.step for c in found if signatures.get(c.revision) == s)))
    kept = [c for c in found if signatures.get(c.revision) == best]
    for ckpt in found:
        sig = signatures.get(ckpt.revision)
        if sig is not None and sig != best:
            diff = sorted(set(sig) ^ set(best))[0]
            reason = (f"different architecture from the folder's other {len(kept)} checkpoints ({diff[0]} {diff[1]}); "
                      "one series is one architecture: give it its own series")  # fmt: skip
            skipped.append(_skip(ckpt.revision, ckpt.step, reason))
    return kept, skipped


def _signature(weights: tuple[Path, ...]) -> frozenset[tuple[str, tuple[int, ...]]]:
    """The 2-D tensors (name, shape) of a checkpoint's files; :class:`CheckpointError` when a file cannot be
    read safely (``SafetensorsFile`` validates; :meth:`SafetensorsFile.size_problem` bounds its sizes)."""
    sig = set()
    for path in weights:
        weights_file = SafetensorsFile(path)
        if problem := weights_file.size_problem():
            raise CheckpointError(problem)
        sig |= {(name, shape) for name in weights_file.names if len(shape := weights_file.shape(name)) == 2}
    return frozenset(sig)


def _json_step(path: Path, key: str) -> int | str | None:
    """The step under ``key`` of a JSON file: an integer in [0, :data:`MAX_STEP`), a reason when the file or the value
    cannot be one, None when the file or the key is absent."""
    if not path.is_file() and not path.exists():
        return None
    record, problem = read_json(path)
    if problem:
        return problem
    value = record.get(key) if isinstance(record, dict) else None
    if value is None:
        return None
    number = finite_number(value)
    if number is None or number != int(number) or not 0 <= number < MAX_STEP:
        return f"{path}: {key} {value!r} is not a step (an integer from 0 to 2**31-1)"
    return int(number)


def _dir_with(first: Path, second: Path, name: str) -> Path | None:
    return next((d for d in (first, second) if (d / name).is_file()), None)


def _tokenizer(first: Path, second: Path) -> Path | None:
    names = ("tokenizer.json", "tokenizer_config.json")
    return next((d for d in (first, second) if any((d / n).is_file() for n in names)), None)


def _skip(revision: str, step: int | None, reason: str) -> dict:
    return {"revision": revision, "step": step, "status": "skipped", "reason": reason}
