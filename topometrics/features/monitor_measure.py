"""What a live monitor's worker process does with one weight snapshot: its weight features, written to the log.

The training side (topometrics.features.monitor) copies the linear weights and submits :func:`measure` to
its worker (:func:`topometrics.execution.compute.background_pool`, which preloads this module in its fork
server: the features' imports are paid once, not per worker). The features are
:func:`topometrics.features.checkpoint.weight_features` (NP, shuffled NP, Vietoris-Rips of rows, spectral
baselines; no forward pass, no distances), so at a checkpoint's step they equal the features
stage's weight features of that checkpoint. With the loss surface on (the monitor's ``surface``) a due
step's snapshot also holds the whole model and its fixed batch, and the ``landscape``/``curvature``
rows follow the weight features (:func:`topometrics.features.monitor_surface.surface_rows`). Each file
records what measured it (the code version of this module's import closure and the digest of the features
params), as a feature shard does.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import numpy as np

from topometrics.execution.shards import module_source_hash, params_digest
from topometrics.features.checkpoint import CheckpointFeatures, features_frame, null_rows, weight_features
from topometrics.features.monitor_surface import ModelSnapshot, surface_rows
from topometrics.models.architectures import oriented
from topometrics.params import FeaturesParams
from topometrics.training.monitor_log import write_measurement
from topometrics.vocabulary import ALL, WEIGHTS, computed_from

DIVERGED = "diverged: non-finite weights in a linear layer"

Snapshot = dict[str, tuple[np.ndarray, bool]]  # layer name -> (float32 weight as stored, transposed flag)


def measure(
    out_dir: Path,
    snapshot: Snapshot,
    params: FeaturesParams,
    rung: str,
    seed: int,
    step: int,
    surface: ModelSnapshot | str | None = None,
) -> dict:
    """Weight features of one snapshot, written as the log's ``features-<step>.parquet``; with ``surface``
    (the model and its batch, or why this step has none) also the ``landscape``/``curvature`` rows.

    Returns the layer-'all' values (feature -> value), ``_seconds``, the time this took, and
    ``_surface_seconds``, the loss surface's part of it (0 without). A snapshot with a non-finite weight
    gives every weight feature NULL with the reason, as a diverged checkpoint does.
    """
    start = time.perf_counter()
    weights = {name: oriented(w, transposed) for name, (w, transposed) in snapshot.items()}
    finite = all(np.isfinite(w).all() for w in weights.values())
    result = weight_features(weights, params) if finite else diverged(weights)
    surface_start = time.perf_counter()
    if surface is not None:
        result.extend(surface_rows(surface, params))
    surface_seconds = time.perf_counter() - surface_start
    write_measurement(out_dir, step, features_frame(result, rung, seed, step), measured_with(params))
    summary = {feature: value for layer, feature, value, _ in result.rows if layer == ALL}
    return summary | {"_seconds": time.perf_counter() - start, "_surface_seconds": surface_seconds}


def diverged(weights: dict[str, np.ndarray]) -> CheckpointFeatures:
    """Every weight feature of these layers and of layer 'all' NULL, with :data:`DIVERGED` as the reason."""
    return null_rows(list(weights), computed_from(WEIGHTS), DIVERGED)  # WEIGHTS: what weight_features computes


def measured_with(params: FeaturesParams) -> dict[str, str]:
    """What a measurement records it was measured with: ``code`` (the version of this module and every
    module it imports, as a shard's fingerprint) and ``params`` (the digest of the features params)."""
    return {"code": _module_source_hash(), "params": params_digest(params)}


@functools.cache
def _module_source_hash() -> str:
    return module_source_hash(__name__)  # once per worker: it reads and parses the import closure's sources
