"""Per-checkpoint features as tidy tables: the computing modules' values under the vocabulary's names.

One path for every checkpoint, ours or an external series' (:func:`linear_and_forward_features`):
the linear weights, each loaded once and in order, and an optional forward/backward pass on a fixed
batch; only loading differs (:func:`checkpoint_features` for our checkpoints,
``topometrics.series.checkpoint`` for Hugging Face ones). Names, definitions and layer aggregations:
``topometrics.vocabulary`` and ``docs/features.md``. Nothing here touches files: a whole run's
checkpoints go to shards through ``topometrics.features.run_shards`` (series: ``topometrics.series.source_shards``).

Tables
------
features : ``(rung, seed, step, layer, feature, value, reason)``; ``layer`` is a linear-layer
    name (``block0.attn.qkv``, ``block0.attn.out``, ``block0.mlp.in``, ``block0.mlp.out``, ...)
    or ``'all'`` for model-level values (aggregates over layers, and the final representation).
    ``value`` is NaN (NULL in Parquet) exactly when ``reason`` says why.
diagrams : ``(rung, seed, step, source, layer, dim, birth, death)``; ``source`` is
    ``'weights'`` (Vietoris-Rips of a layer's rows) or ``'representation'`` (``layer='all'``);
    finite bars only (the essential H0 bar of every cloud is implied, see topometrics.measures.persistence).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from topometrics.dynamics.trajectory import CheckpointIterate
from topometrics.features.forward import ForwardPass, LossSurface, NoForwardPass, model_on_batch, on_device
from topometrics.features.gradient_cloud import clouds_of, gradient_rows
from topometrics.landscape.surface import SurfaceSettings, surface_values
from topometrics.measures.heavy_tail import covariance_alpha
from topometrics.measures.layer_features import OFF, aggregate_layers, layer_features
from topometrics.measures.persistence import (
    finite_bars,
)
from topometrics.measures.representation import representation_topology
from topometrics.measures.spectral import covariance_spectrum
from topometrics.models.model import GPTConfig, gpt_on, linear_layer_names, linear_weights, pick_device
from topometrics.params import FeaturesParams
from topometrics.vocabulary import (
    ALL,
    CURVATURE,
    FAMILIES,
    FEATURES,
    FORWARD,
    LANDSCAPE,
    REPRESENTATION,
    STATES,
    WEIGHTS,
    Rows,
    computed_from,
    lookup,
    model_only,
    named,
)

FEATURE_COLUMNS = ["rung", "seed", "step", "layer", "feature", "value", "reason"]
DIAGRAM_COLUMNS = ["rung", "seed", "step", "source", "layer", "dim", "birth", "death"]


@dataclass
class CheckpointFeatures:
    """Features and diagrams of one checkpoint, before the rung/seed/step columns are added."""

    rows: list[tuple[str, str, float, str | None]] = field(default_factory=list)  # layer, feature, value, reason
    diagrams: dict[tuple[str, str], list[np.ndarray]] = field(default_factory=dict)  # (source, layer) -> [H0, H1]
    iterate: np.ndarray | None = None  # (64,) the checkpoint as a trajectory iterate (dynamics.trajectory); None: off

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
# One checkpoint: linear weights + an optional forward pass
# ---------------------------------------------------------------------------


def linear_and_forward_features(
    weights: Mapping[str, Callable[[], np.ndarray]],
    global_max: float,
    forward: Callable[[], ForwardPass] | None,
    params: FeaturesParams,
) -> CheckpointFeatures:
    """All features of one finite checkpoint except the distances to the previous one.

    Parameters
    ----------
    weights : {layer name: loader of its (out, in) array}
        The linear layers in network order; each loader is called once, in order, so a caller
        that reads layers lazily holds one layer in memory at a time. The array a loader returns
        is overwritten (:func:`layer_features` ``overwrite``): return a fresh read or a copy.
    global_max : float
        ``max |w|`` over all the linear layers (neural persistence's normalisation).
    forward : callable or None
        Runs the forward/backward pass on the fixed batch; it raises :class:`NoForwardPass` when
        the model cannot run (those rows are then NULL with the reason). None: weight features only.
    params : FeaturesParams

    Returns
    -------
    CheckpointFeatures
        Weight features per layer and their ``layer='all'`` aggregates, diagrams
        ``('weights', layer)``; then gradient norms, the batch loss and the representation.
    """
    out = CheckpointFeatures()
    per_layer_values, alpha_reasons = {}, []
    iterate = CheckpointIterate(params.seed) if "trajectory" in params.families else None
    for i, (name, load) in enumerate(weights.items()):
        w = load()
        if iterate is not None:  # before layer_features overwrites w
            iterate.add(w)
        values, out.diagrams[("weights", name)], alpha = layer_features(w, global_max, params, i, overwrite=True)
        per_layer_values[name] = values | {"w_alpha": alpha.alpha}
        out.add(name, values)
        out.add(name, {"w_alpha": alpha.alpha}, alpha.reason)  # NULL with its own reason on narrow layers
        alpha_reasons.append(alpha.reason)
    aggregates = aggregate_layers(per_layer_values)
    alpha = aggregates.pop("w_alpha")
    out.add(ALL, aggregates)
    out.add(ALL, {"w_alpha": alpha}, None if np.isfinite(alpha) else f"no layer fitted: {alpha_reasons[0]}")
    if forward is not None and not needs_forward(params.families):  # no pass for rows that would be NULL
        out.extend(null_rows(list(weights), computed_from(FORWARD, STATES, scales=params.betti_scales), OFF))
    elif forward is not None:
        out.extend(forward_features(forward, list(weights), params))
    out.iterate = None if iterate is None else iterate.point()
    return switched_off(out, params)


def needs_forward(families: tuple[str, ...]) -> bool:
    """Whether any of ``families`` has a feature computed from the forward pass or its hidden states (the
    gradient, representation, loss-surface and gradient-cloud families, and heavy_tail's ``rep_alpha``)."""
    return any(f.family.name in families for f in FEATURES if (f.input or f.family.input) in (FORWARD, STATES))


def switched_off(result: CheckpointFeatures, params: FeaturesParams) -> CheckpointFeatures:
    """``result`` with the rows of the families not in ``features.families`` NULL (with the reason), and
    their diagrams dropped (so the distances to the previous checkpoint say the diagram is missing)."""
    off = {family.name for family in FAMILIES} - set(params.families)
    if not off:
        return result
    reason = OFF
    out = CheckpointFeatures(diagrams=dict(result.diagrams), iterate=result.iterate)
    for layer, name, value, why in result.rows:
        feature = lookup(name)
        out.rows.append(
            (layer, name, np.nan, reason) if feature and feature.family.name in off else (layer, name, value, why)
        )
    for source, family in (("weights", "vr"), ("representation", "representation")):
        if family in off:
            out.diagrams = {key: d for key, d in out.diagrams.items() if key[0] != source}
    return out


def forward_features(
    forward: Callable[[], ForwardPass], layers: list[str], params: FeaturesParams
) -> CheckpointFeatures:
    """Gradient norms per layer and over all, the batch loss, and the representation features.

    NULL with the reason for every one of them when ``forward`` raises :class:`NoForwardPass`.
    """
    out = CheckpointFeatures()
    try:
        result = forward()
    except NoForwardPass as err:
        return null_rows(layers, computed_from(FORWARD, STATES, scales=params.betti_scales), str(err))
    for name, value in result.grad_norms.items():
        out.add(name, {"grad_norm": value})
    out.add(ALL, aggregate_layers({name: {"grad_norm": v} for name, v in result.grad_norms.items()}))
    out.add(ALL, {"batch_loss": result.loss})
    unknown = None if math.isfinite(result.bpb) else "the bytes the batch's targets stand for are unknown"
    out.add(ALL, {"batch_bpb": result.bpb}, unknown)
    if REPRESENTATION.name in params.families:
        out.extend(representation_features(result.states, params))
    else:  # not computed (switched_off writes the reason)
        out.add(ALL, dict.fromkeys(computed_from(STATES, scales=params.betti_scales).model_level, np.nan), "off")
    out.extend(surface_features(result.surface, params))
    for layer, values, reason in gradient_rows(result.gradients, layers, params):
        out.add(layer, values, reason)
    return out


def surface_features(surface: LossSurface | str, params: FeaturesParams) -> CheckpointFeatures:
    """The ``landscape`` and ``curvature`` rows (layer ``'all'``) of the loss on the loss-surface batch.

    NULL with the reason when ``surface`` is one (not a loss-surface checkpoint, a batch larger than the
    validation split), when both families are switched off, or when the computation fails on the model
    (an operation without a batched or forward-mode rule); values NULL on their own carry the reasons of
    :func:`topometrics.landscape.surface.surface_values`.
    """
    out = CheckpointFeatures()
    landscape, curvature = model_only(LANDSCAPE), model_only(CURVATURE)
    if not {LANDSCAPE.name, CURVATURE.name} & set(params.families):
        surface = "off"  # switched_off writes the reason
    if isinstance(surface, str):
        out.add(ALL, dict.fromkeys(landscape + curvature, np.nan), surface)
        return out
    settings = SurfaceSettings(
        params.landscape_grid,
        params.landscape_radius,
        params.hessian_top,
        params.hessian_probes,
        params.hessian_iters,
        params.seed,
        exact_max=params.hessian_exact_max,
        trace_rse=params.hessian_trace_rse,
        probes_max=params.hessian_probes_max,
    )
    try:
        on = set(params.families)
        found = surface_values(
            surface.loss, surface.params, settings, surface.windows, LANDSCAPE.name in on, CURVATURE.name in on
        )
    except RuntimeError as err:
        reason = f"loss surface not computable on this model: {err}".splitlines()[0]
        out.add(ALL, dict.fromkeys(landscape + curvature, np.nan), reason)
        return out
    for family, values in zip((LANDSCAPE, CURVATURE), found, strict=True):
        if values is None:  # switched off: not computed
            out.add(ALL, dict.fromkeys(model_only(family), np.nan), OFF)
            continue
        for key, value in values.values.items():
            out.add(ALL, named(family, {key: value}), values.reasons.get(key))
    return out


def representation_features(states: np.ndarray, params: FeaturesParams) -> CheckpointFeatures:
    """Topology and spectrum of the hidden-state cloud (layer ``'all'``, source ``'representation'``).

    Topology on a seeded subsample of ``rep_points`` states after PCA to ``rep_dim``
    (:func:`topometrics.measures.representation.representation_topology`); ``rep_rankme``/``rep_pr`` on all
    states. Non-finite states give NULLs with a reason.
    """
    out = CheckpointFeatures()
    if not np.isfinite(states).all():
        names = computed_from(STATES, scales=params.betti_scales).model_level
        out.add(ALL, dict.fromkeys(names, np.nan), "non-finite hidden states")
        return out
    topo, dgms = representation_topology(
        states, params.rep_points, params.rep_dim, params.seed, params.significance, params.betti_scales
    )
    out.add(ALL, named(REPRESENTATION, {**topo, **covariance_spectrum(states)}))
    alpha = covariance_alpha(states)
    out.add(ALL, {"rep_alpha": alpha.alpha}, alpha.reason)
    out.diagrams[("representation", ALL)] = dgms
    return out


def null_features(layers: list[str], params: FeaturesParams, reason: str) -> CheckpointFeatures:
    """The full set of feature rows of a checkpoint with linear layers ``layers``, all NULL with ``reason``."""
    rows = computed_from(WEIGHTS, FORWARD, STATES, scales=params.betti_scales)
    return switched_off(null_rows(layers, rows, reason), params)


def null_rows(layers: list[str], rows: Rows, reason: str) -> CheckpointFeatures:
    """``rows.per_layer`` for each of ``layers`` and ``rows.model_level`` for ``'all'``, all NULL with ``reason``."""
    out = CheckpointFeatures()
    for name in layers:
        out.add(name, dict.fromkeys(rows.per_layer, np.nan), reason)
    out.add(ALL, dict.fromkeys(rows.model_level, np.nan), reason)
    return out


# ---------------------------------------------------------------------------
# Our checkpoints: a state dict and the GPT forward pass
# ---------------------------------------------------------------------------


def checkpoint_features(
    state: dict[str, torch.Tensor],
    config: GPTConfig,
    batch: tuple[torch.Tensor, torch.Tensor],
    params: FeaturesParams,
    surface: tuple[torch.Tensor, torch.Tensor] | str = "no loss-surface batch given",
    n_bytes: float | None = None,
    gradients: tuple[torch.Tensor, torch.Tensor] | str = "no gradient batch given",
) -> CheckpointFeatures:
    """All features of one of our checkpoints except the distances to the previous one; ``surface``
    is the loss-surface batch (:func:`surface_batch`) and ``gradients`` the per-example gradients' batch
    (:func:`topometrics.features.gradient_cloud.gradient_batch`), or the reasons there are none.

    A diverged checkpoint (NaN/Inf in any tensor) gives NULL for every feature with the reason,
    and a ``RuntimeWarning``; it never raises.
    """
    bad = [int((~torch.isfinite(t)).sum()) for t in state.values() if not torch.isfinite(t).all()]
    if bad:
        reason = diverged_reason(bad)
        warnings.warn(reason, RuntimeWarning, stacklevel=2)
        return null_features(linear_layer_names(config.layers), params, reason)
    device = pick_device(params.device, "features.device")
    model = gpt_on(state, config).to(device)  # on the CPU the state's own tensors: the weights held once
    loaders, global_max = in_memory(linear_weights(state, config.layers))
    batches = [on_device(b, device) for b in (batch, surface, gradients)]
    return linear_and_forward_features(
        loaders,
        global_max,
        lambda: model_on_batch(model, *batches[0], batches[1], n_bytes, batches[2], clouds_of(params)),
        params,
    )


def diverged_reason(non_finite: list[int]) -> str:
    """The NULL reason of a diverged model, from the count of non-finite entries of each tensor that has any."""
    return f"diverged: non-finite weights in {len(non_finite)} tensors ({sum(non_finite)} entries)"


def weight_features(weights: dict[str, np.ndarray], params: FeaturesParams) -> CheckpointFeatures:
    """The weight features alone (no forward pass) of finite in-memory linear layers, in network order."""
    return linear_and_forward_features(*in_memory(weights), None, params)


def in_memory(weights: dict[str, np.ndarray]) -> tuple[dict[str, Callable[[], np.ndarray]], float]:
    """Loaders of in-memory layers (each a copy: the features overwrite what a loader gives) and
    ``max |w|`` over all of them."""
    global_max = max(float(np.abs(w).max()) for w in weights.values())
    return {name: lambda w=w: np.array(w, order="C") for name, w in weights.items()}, global_max


# ---------------------------------------------------------------------------
# Tables (written as shards by topometrics.features.run_shards)
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
