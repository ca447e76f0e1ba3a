"""Resolving hub revisions of an external checkpoint series to local files (run folders: ``run_folders``).

Hub revisions resolve through ``huggingface_hub.snapshot_download``, so the Hugging Face cache
(``HF_HOME`` / ``HF_HUB_CACHE``) and ``HF_HUB_OFFLINE`` are honoured; only safetensors, configs and
tokenizer files are fetched, never pickle weights. A revision or entry that cannot be resolved is
yielded as a skip record with its reason, never raised.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import snapshot_download

from topometrics.series.run_folders import BEYOND_STEPS, MAX_STEP

# Files fetched per hub revision: weights, configs, tokenizer. Never *.bin (pickle).
HUB_PATTERNS = ["*.safetensors", "*.json", "tokenizer*"]
_STEP_NAME = re.compile(r"(?:step|checkpoint)[-_]?(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class SeriesCheckpoint:
    """One checkpoint of a series, resolved to local files."""

    step: int
    revision: str  # hub revision, or the entry's name in a local folder
    weights: tuple[Path, ...]  # safetensors files (shards) holding the state dict
    config_dir: Path | None  # folder with config.json for transformers (None: weight features only)
    tokenizer_dir: Path | None  # folder with the model's own tokenizer files


def step_from_name(name: str) -> int | None:
    """The step in a name like ``step1000``, ``step_001000`` or ``checkpoint-1000`` (None if absent)."""
    match = _STEP_NAME.search(name)
    return int(match.group(1)) if match else None


def revision_steps(revisions: tuple[str, ...]) -> tuple[dict[str, int], list[dict]]:
    """Each revision's step (:func:`step_from_name`), in step order, and a skip record for each revision whose
    name gives none, or one the warehouse's 32-bit step column cannot hold (:data:`MAX_STEP`)."""
    steps, skips = {}, []
    for revision in revisions:
        step = step_from_name(revision)
        if step is None:
            reason = f"cannot tell the step of revision {revision!r}; name a step<N> branch"
        elif step >= MAX_STEP:
            reason = f"revision {revision!r}: step {step:,} {BEYOND_STEPS}"
        else:
            steps[revision] = step
            continue
        skips.append(skip_record(revision, None, reason))
    return dict(sorted(steps.items(), key=lambda item: item[1])), skips


def hub_checkpoints(model_id: str, revisions: tuple[str, ...], cache_dir: Path | None = None) -> Iterator:
    """Resolve hub revisions one at a time, in step order: yields SeriesCheckpoint or a skip dict.

    ``snapshot_download`` uses the cache first when offline (``HF_HUB_OFFLINE=1``) or when the hub
    cannot be reached; any failure to get the files is a skip with the reason.
    """
    steps, skips = revision_steps(revisions)
    yield from skips
    for revision in steps:
        try:
            folder = Path(
                snapshot_download(model_id, revision=revision, allow_patterns=HUB_PATTERNS, cache_dir=cache_dir)
            )
        except (OSError, ValueError) as err:
            reason = f"not cached and not downloadable ({type(err).__name__}: {str(err).splitlines()[0]})"
            yield skip_record(revision, steps[revision], reason)
            continue
        weights = tuple(sorted(folder.glob("*.safetensors")))
        if not weights:
            yield skip_record(
                revision, steps[revision], f"{folder}: no .safetensors files (pickle weights are never loaded)"
            )
            continue
        yield SeriesCheckpoint(
            steps[revision], revision, weights, _if_has(folder, "config.json"), _tokenizer_dir(folder)
        )


def _if_has(folder: Path, name: str) -> Path | None:
    return folder if (folder / name).is_file() else None


def _tokenizer_dir(folder: Path) -> Path | None:
    return folder if any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")) else None


def skip_record(revision: str, step: int | None, reason: str) -> dict:
    return {"revision": revision, "step": step, "status": "skipped", "reason": reason}


def weights_sha256(files: tuple[Path, ...]) -> str | None:
    """The content hash of the weights when the HF cache names it (its blob is ``blobs/<sha256>``).

    Free for hub checkpoints; used to flag revisions that serve identical files (reported for some
    Pythia step branches, EleutherAI/pythia issue 205). None for local files.
    """
    blobs = [Path(os.path.realpath(p)) for p in files]
    if not all(b.parent.name == "blobs" for b in blobs):
        return None
    return ",".join(b.name for b in blobs)
