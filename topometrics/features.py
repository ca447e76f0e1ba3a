"""Per-checkpoint topological and spectral features as tidy tables (issue 3).

Computing functions take arrays, tensors and params and return :class:`CheckpointFeatures`;
only :func:`run_features` touches files (it is the edge the stage calls). Feature names and
definitions: ``docs/features.md``.

Tables
------
features : ``(rung, seed, step, layer, feature, value, reason)``; ``layer`` is a linear-layer
    name (``block0.attn.qkv``, ``block0.attn.out``, ``block0.mlp.in``, ``block0.mlp.out``, ...)
    or ``'all'`` for model-level values (aggregates over layers, and the final representation).
    ``value`` is NaN (NULL in Parquet) exactly when ``reason`` says why.
diagrams : ``(rung, seed, step, source, layer, dim, birth, death)``; ``source`` is
    ``'weights'`` (Vietoris-Rips of a layer's rows) or ``'representation'`` (``layer='all'``);
    finite bars only (the essential H0 bar of every cloud is implied, see topometrics.persistence).
"""

from __future__ import annotations

import multiprocessing
import sys
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from threadpoolctl import threadpool_limits

from topometrics.checkpoints import Checkpoint, list_checkpoints, load_state
from topometrics.model import GPT, GPTConfig, linear_layer_names, linear_modules, linear_weights
from topometrics.params import FeaturesParams
from topometrics.persistence import (
    bottleneck_distance,
    diagram_summary,
    finite_bars,
    neural_persistence,
    representation_topology,
    shuffled_neural_persistence,
    subsample_rows,
    vietoris_rips_diagrams,
    wasserstein_distance,
)
from topometrics.spectral import covariance_spectrum, weight_spectrum
from topometrics.vocabulary import ALL, DISTANCE, FAMILIES, REPRESENTATION, lookup, model_level, model_only, per_layer

FEATURE_COLUMNS = ["rung", "seed", "step", "layer", "feature", "value", "reason"]
DIAGRAM_COLUMNS = ["rung", "seed", "step", "source", "layer", "dim", "birth", "death"]


@dataclass
class CheckpointFeatures:
    """Features and diagrams of one checkpoint, before the rung/seed/step columns are added."""

    rows: list[tuple[str, str, float, str | None]] = field(default_factory=list)  # layer, feature, value, reason
    diagrams: dict[tuple[str, str], list[np.ndarray]] = field(default_factory=dict)  # (source, layer) -> [H0, H1]

    def add(self, layer: str, values: dict[str, float], reason: str | None = None) -> None:
        for name, value in values.items():
            value, why = float(value), reason
            if not np.isfinite(value):
                # A NULL always carries its reason; an overflow gets a generic one.
                why = why or f"non-finite {name}"
            self.rows.append((layer, name, np.nan if why else value, why))

    def extend(self, other: CheckpointFeatures) -> None:
        self.rows.extend(other.rows)
        self.diagrams.update(other.diagrams)


# ---------------------------------------------------------------------------
# Weight space
# ---------------------------------------------------------------------------


def weight_features(weights: dict[str, np.ndarray], params: FeaturesParams) -> CheckpointFeatures:
    """NP, shuffled NP, Vietoris-Rips of rows and spectral baselines of every linear layer.

    Parameters
    ----------
    weights : {layer name: (out, in) array}
        The linear layers in network order (``topometrics.model.linear_weights``), finite.
    params : FeaturesParams
        ``max_points`` (rows per layer for Vietoris-Rips) and ``seed`` (row subsample and
        shuffled null; the null of layer ``i`` uses ``default_rng([seed, i])``).

    Returns
    -------
    CheckpointFeatures
        Rows per layer and the ``layer='all'`` aggregates; diagrams ``('weights', layer)``.
    """
    global_max = max(float(np.abs(w).max()) for w in weights.values())
    return loaded_weight_features({name: lambda w=w: w for name, w in weights.items()}, global_max, params)


def loaded_weight_features(
    loaders: dict[str, Callable[[], np.ndarray]], global_max: float, params: FeaturesParams
) -> CheckpointFeatures:
    """:func:`weight_features` with each layer produced by a loader, called once and in order, so a
    caller that reads layers lazily (``topometrics.series``) holds one layer in memory at a time.

    ``global_max`` is ``max |w|`` over all the layers (the caller's first pass when streaming).
    """
    out = CheckpointFeatures()
    per_layer = {}
    for i, (name, load) in enumerate(loaders.items()):
        values = layer_features(load(), global_max, params.max_points, [params.seed, i], params.seed)
        out.diagrams[("weights", name)] = values.pop("_diagrams")
        per_layer[name] = values
        out.add(name, values)
    out.add(ALL, aggregate_layers(per_layer))
    return out


def layer_features(
    weight: np.ndarray, global_max: float, max_points: int, null_seed: list[int], row_seed: int
) -> dict[str, float]:
    """Features of one layer (see :func:`weight_features`); ``'_diagrams'`` holds its VR diagrams."""
    np_value = neural_persistence(weight, global_max)
    dgms = vietoris_rips_diagrams(subsample_rows(weight, max_points, row_seed))
    summary = diagram_summary(dgms)
    return {
        "np_norm": np_value.np_norm,
        "np_sum": np_value.np_sum,
        "np_shuffled_norm": shuffled_neural_persistence(weight, global_max, null_seed).np_norm,
        **{f"vr_{name}": value for name, value in summary.items()},
        **weight_spectrum(weight),
        "_diagrams": dgms,
    }


def aggregate_layers(per_layer_values: dict[str, dict[str, float]]) -> dict[str, float]:
    """The ``layer='all'`` values of per-layer features, by each feature's declared aggregation
    (``topometrics.vocabulary``): e.g. NP mean and population std, VR sums, the global Frobenius norm.

    Parameters
    ----------
    per_layer_values : {layer name: {feature name: value}}, the same feature names for every layer
    """
    first = next(iter(per_layer_values.values()))
    columns = {name: np.array([v[name] for v in per_layer_values.values()]) for name in first}
    out = {}
    for name, values in columns.items():
        feature = lookup(name)
        if feature is None or feature.aggregate not in _AGGREGATIONS:
            raise ValueError(f"{name} is not a declared per-layer feature; declare it in topometrics/vocabulary.py")
        if feature.aggregate == "mean_std":
            out[name], out[f"{name}_std"] = values.mean(), values.std()
        else:
            out[name] = _AGGREGATIONS[feature.aggregate](values)
    return out


_AGGREGATIONS = {
    "mean_std": np.mean,
    "mean": np.mean,
    "sum": np.sum,
    "max": np.max,
    "norm": lambda values: np.sqrt(np.sum(values**2)),
}


# ---------------------------------------------------------------------------
# Forward/backward on the fixed batch
# ---------------------------------------------------------------------------


def validation_batch(tokens: np.ndarray, context: int, windows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed batch: window i is ``tokens[i*context : (i+1)*context]``, targets shifted by one.

    Returns
    -------
    x, y : (windows, context) int64 tensors
    """
    needed = windows * context + 1
    if tokens.size < needed:
        raise ValueError(
            f"validation corpus has {tokens.size} tokens, the fixed batch needs {needed} "
            f"({windows} windows of {context} + 1); lower features.rep_batch"
        )
    flat = torch.from_numpy(np.asarray(tokens[:needed], dtype=np.int64))
    return flat[:-1].view(windows, context), flat[1:].view(windows, context)


def model_on_batch(model: GPT, x: torch.Tensor, y: torch.Tensor) -> tuple[np.ndarray, dict[str, float], float]:
    """Hidden states after the last block, per-layer weight-gradient norms and the batch loss.

    Returns
    -------
    states : (windows * context, hidden) float64 array
    grad_norms : {layer name: Frobenius norm of d loss / d W} (biases excluded)
    loss : mean next-token cross-entropy on the batch (nats)
    """
    model.zero_grad(set_to_none=True)
    loss = model.loss(x, y)
    loss.backward()
    grads = {name: float(module.weight.grad.norm()) for name, module in linear_modules(model).items()}
    with torch.no_grad():
        states = model.hidden_states(x)
    model.zero_grad(set_to_none=True)
    return states.reshape(-1, states.shape[-1]).double().numpy(), grads, loss.item()


def representation_features(states: np.ndarray, params: FeaturesParams) -> CheckpointFeatures:
    """Topology and spectrum of the hidden-state cloud (layer ``'all'``, source ``'representation'``).

    Topology on a seeded subsample of ``rep_points`` states after PCA to ``rep_dim``
    (:func:`topometrics.persistence.representation_topology`); ``rep_rankme``/``rep_pr`` on all
    states. Non-finite states give NULLs with a reason.
    """
    out = CheckpointFeatures()
    if not np.isfinite(states).all():
        out.add(ALL, dict.fromkeys(rep_feature_names(params), np.nan), "non-finite hidden states")
        return out
    topo, dgms = representation_topology(
        states, params.rep_points, params.rep_dim, params.seed, params.significance, params.betti_scales
    )
    out.add(ALL, {**topo, **covariance_spectrum(states)})
    out.diagrams[("representation", ALL)] = dgms
    return out


def rep_feature_names(params: FeaturesParams) -> tuple[str, ...]:
    """Names of the representation features, in the order they are written."""
    return model_only(REPRESENTATION, params.betti_scales)


# ---------------------------------------------------------------------------
# One checkpoint
# ---------------------------------------------------------------------------


def checkpoint_features(
    state: dict[str, torch.Tensor], config: GPTConfig, batch: tuple[torch.Tensor, torch.Tensor], params: FeaturesParams
) -> CheckpointFeatures:
    """All features of one checkpoint except the distances to the previous one.

    A diverged checkpoint (NaN/Inf in any tensor) gives NULL for every feature with the reason,
    and a ``RuntimeWarning``; it never raises.
    """
    bad = {name: int((~torch.isfinite(t)).sum()) for name, t in state.items() if not torch.isfinite(t).all()}
    if bad:
        reason = f"diverged: non-finite weights in {len(bad)} tensors ({sum(bad.values())} entries)"
        warnings.warn(reason, RuntimeWarning, stacklevel=2)
        return null_features(config.layers, params, reason)
    model = GPT(config)
    model.load_state_dict(state)
    out = weight_features(linear_weights(state, config.layers), params)
    states, grads, loss = model_on_batch(model, *batch)
    for name, value in grads.items():
        out.add(name, {"grad_norm": value})
    out.add(ALL, {"grad_norm": np.sqrt(np.sum(np.square(list(grads.values())))), "batch_loss": loss})
    out.extend(representation_features(states, params))
    return out


def null_features(layers: int, params: FeaturesParams, reason: str) -> CheckpointFeatures:
    """The full set of feature rows of a checkpoint, all NULL with ``reason``."""
    out = CheckpointFeatures()
    computed = [family for family in FAMILIES if family not in (REPRESENTATION, DISTANCE)]
    for name in linear_layer_names(layers):
        out.add(name, dict.fromkeys([n for family in computed for n in per_layer(family)], np.nan), reason)
    aggregate = [n for family in computed for n in model_level(family)]
    out.add(ALL, dict.fromkeys(aggregate + list(rep_feature_names(params)), np.nan), reason)
    return out


def distance_features(
    prev: CheckpointFeatures | None, cur: CheckpointFeatures, layers: list[str]
) -> CheckpointFeatures:
    """Wasserstein-1 and bottleneck distances of each diagram to the previous checkpoint's.

    Per layer, the distance between the graded diagrams ``[H0, H1]`` with matchings inside a
    dimension: W1 is the sum of the per-dimension W1, bottleneck the per-dimension maximum.
    ``layer='all'`` sums both over layers. Finite bars only. NULL with a reason for the first
    checkpoint or when either diagram is missing (diverged checkpoint).
    """
    out = CheckpointFeatures()
    layer_names, model_names = per_layer(DISTANCE), model_only(DISTANCE)
    totals = {name: 0.0 for name in layer_names}
    total_reason = None
    for layer in layers:
        values, reason = _graded_distances(prev, cur, ("weights", layer), layer_names)
        out.add(layer, values, reason)
        total_reason = total_reason or reason
        totals = {k: totals[k] + values[k] for k in totals}
    out.add(ALL, totals, total_reason)
    values, reason = _graded_distances(prev, cur, ("representation", ALL), model_names)
    out.add(ALL, values, reason)
    return out


def _graded_distances(prev, cur, key, names) -> tuple[dict[str, float], str | None]:
    if prev is None:
        return dict.fromkeys(names, np.nan), "first checkpoint: no previous diagram"
    if key not in prev.diagrams or key not in cur.diagrams:
        return dict.fromkeys(names, np.nan), "diagram missing at this or the previous checkpoint"
    pairs = list(zip(prev.diagrams[key], cur.diagrams[key], strict=True))
    w1 = sum(wasserstein_distance(a, b) for a, b in pairs)
    bneck = max(bottleneck_distance(a, b) for a, b in pairs)
    return dict(zip(names, (w1, bneck), strict=True)), None


# ---------------------------------------------------------------------------
# Tables and the run directory (the edge)
# ---------------------------------------------------------------------------


def features_frame(result: CheckpointFeatures, rung: str, seed: int, step: int) -> pd.DataFrame:
    frame = pd.DataFrame(result.rows, columns=["layer", "feature", "value", "reason"])
    frame.insert(0, "step", step)
    frame.insert(0, "seed", seed)
    frame.insert(0, "rung", rung)
    return frame.astype({"value": "float64", "reason": "object"})


def diagrams_frame(result: CheckpointFeatures, rung: str, seed: int, step: int) -> pd.DataFrame:
    parts = []
    for (source, layer), dgms in result.diagrams.items():
        for dim, dgm in enumerate(dgms):
            bars = finite_bars(dgm)
            parts.append(
                pd.DataFrame({"source": source, "layer": layer, "dim": dim, "birth": bars[:, 0], "death": bars[:, 1]})
            )
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=DIAGRAM_COLUMNS[3:])
    frame.insert(0, "step", step)
    frame.insert(0, "seed", seed)
    frame.insert(0, "rung", rung)
    return frame.astype({"dim": "int64", "birth": "float64", "death": "float64"})


def run_features(
    run_dir: Path, corpus_dir: Path, params: FeaturesParams, rung: str | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Features and diagrams of every checkpoint of one rung's run directory.

    Checkpoints are processed in a process pool of ``params.workers`` (each worker one torch
    and one BLAS thread) when there are at least 4
    checkpoints per worker; distances to the previous checkpoint are a second parallel map over
    consecutive pairs. Progress goes to stderr: a tqdm bar on a TTY, a plain line about every
    10% otherwise.

    Parameters
    ----------
    run_dir : directory with ``step_*.safetensors`` + ``.json`` sidecars
    corpus_dir : directory with ``val.u8`` (uint8 token ids)
    params : FeaturesParams
    rung : name for the ``rung`` column; defaults to the sidecar's ``rung``

    Returns
    -------
    features, diagrams : DataFrames with :data:`FEATURE_COLUMNS` and :data:`DIAGRAM_COLUMNS`
    """
    ckpts = list_checkpoints(Path(run_dir))
    if not ckpts:
        raise FileNotFoundError(f"{run_dir}: no complete checkpoints (step_*.safetensors + .json); run training first")
    tokens = np.fromfile(Path(corpus_dir) / "val.u8", dtype=np.uint8)
    layers = linear_layer_names(ckpts[0].config.layers)
    with _pool(params.workers, len(ckpts)) as pool:
        results = _map(pool, _checkpoint_job, [(ckpt, tokens, params) for ckpt in ckpts], "features")
        pairs = [(prev, cur, layers) for prev, cur in zip([None, *results[:-1]], results, strict=True)]
        distances = _map(pool, _distance_job, pairs, "distances")
    features, diagrams = [], []
    for ckpt, result, dist in zip(ckpts, results, distances, strict=True):
        name = rung or ckpt.meta.get("rung", Path(run_dir).name)
        seed = int(ckpt.meta.get("seed", -1))
        result.rows.extend(dist.rows)
        features.append(features_frame(result, name, seed, ckpt.step))
        diagrams.append(diagrams_frame(result, name, seed, ckpt.step))
    return pd.concat(features, ignore_index=True), pd.concat(diagrams, ignore_index=True)


def _checkpoint_job(job: tuple[Checkpoint, np.ndarray, FeaturesParams]) -> CheckpointFeatures:
    ckpt, tokens, params = job
    config = ckpt.config
    batch = validation_batch(tokens, config.context, params.rep_batch)
    return checkpoint_features(load_state(ckpt.path), config, batch, params)


def _distance_job(job) -> CheckpointFeatures:
    return distance_features(*job)


def _worker_init() -> None:
    # Parallelism is over checkpoints; one thread per process avoids oversubscribing cores
    # (multi-threaded BLAS on these small matrices was 5-20x slower on a busy 2-core box).
    torch.set_num_threads(1)
    threadpool_limits(1)


# Imported once by the fork server; its children start with torch, scipy and ripser loaded.
_PRELOAD = ["topometrics.features"]


@contextmanager
def _pool(workers: int, jobs: int):
    """A process pool when it pays (several jobs per worker), else None (run in-process).

    One pool serves both maps. Workers come from a fork server that imports this module
    (torch, scipy, ripser) once per main process and forks a ready worker per slot: spawned
    workers each paid the ~3-4 s import (both at once on two cores, and again for every pool
    of a stage) and another ~1 s to exit. Not plain fork of this process: forking a process
    that has run torch (OpenMP) threads can deadlock; the fork server only imports, so torch
    has started no threads there, and OpenBLAS's idle pool shuts down around a fork by itself.
    spawn where there is no fork server (Windows).
    """
    if workers <= 1 or jobs < 4 * workers:
        with _one_thread():
            yield None
        return
    with ProcessPoolExecutor(workers, mp_context=_pool_context(), initializer=_worker_init) as pool:
        yield pool


def _pool_context() -> multiprocessing.context.BaseContext:
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    # Only read when the server starts (the first pool of this process); harmless later.
    context.set_forkserver_preload(_PRELOAD)
    return context


@contextmanager
def _one_thread():
    """torch and BLAS on one thread, as in a worker (so results match), restored afterwards."""
    threads = torch.get_num_threads()
    try:
        with threadpool_limits(1):
            torch.set_num_threads(1)
            yield
    finally:
        torch.set_num_threads(threads)


def _map(pool: ProcessPoolExecutor | None, fn, jobs: list, label: str) -> list:
    """``[fn(j) for j in jobs]`` in the pool (or in-process), in order, with progress."""
    progress = _Progress(len(jobs), label)
    # chunksize 1: jobs take 10 ms to seconds, so load balance beats saving IPC.
    results = (fn(job) for job in jobs) if pool is None else pool.map(fn, jobs)
    out = []
    for result in results:
        out.append(result)
        progress.step()
    progress.close()
    return out


class _Progress:
    """tqdm on a TTY, otherwise a plain stderr line about every 10% (CI and DVC logs)."""

    def __init__(self, total: int, label: str) -> None:
        self.total, self.label, self.done, self.start = total, label, 0, time.monotonic()
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=label, file=sys.stderr)

    def step(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
        elif self.done == self.total or self.done % max(1, self.total // 10) == 0:
            elapsed = time.monotonic() - self.start
            print(f"{self.label}: {self.done}/{self.total} checkpoints, {elapsed:.1f} s", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
