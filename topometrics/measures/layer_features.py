"""The weight features of one linear layer, and their ``layer='all'`` aggregation over a network.

:func:`layer_features` computes every per-layer weight feature of the vocabulary's weight
families (NP, Vietoris-Rips of rows, spectral, scale-free, heavy-tail) from one ``(out, in)``
array, in an order that holds the layer and one working set at a time (a streaming worker's
memory, docs/scaling.md); :func:`aggregate_layers` combines per-layer values by each feature's
declared aggregation (:mod:`topometrics.vocabulary`). Pure functions over arrays.
"""

from __future__ import annotations

import numpy as np

from topometrics.measures.heavy_tail import AlphaFit, fit_tail
from topometrics.measures.neural_persistence import (
    bipartite_max_spanning_tree,
    shuffled_neural_persistence,
    tree_persistence,
)
from topometrics.measures.persistence import diagram_summary, rips_diagrams, row_distances, subsample_indices
from topometrics.measures.scale_free import np_excess, scale_free_features
from topometrics.measures.spectral import singular_values, weight_spectrum
from topometrics.params import FeaturesParams
from topometrics.vocabulary import HEAVY_TAIL, NP, SCALE_FREE, SPECTRAL, VR, lookup, named, per_layer

WEIGHT_FAMILIES = {family.name: family for family in (NP, VR, SPECTRAL, SCALE_FREE, HEAVY_TAIL)}
OFF = "family switched off (features.families)"  # the reason a family that is off leaves


def layer_features(
    weight: np.ndarray, global_max: float, params: FeaturesParams, index: int, *, overwrite: bool = False
) -> tuple[dict[str, float], list[np.ndarray], AlphaFit]:
    """NP, shuffled NP, Vietoris-Rips of rows, spectral baselines and the scale-free set of the
    ``index``-th linear layer, and its heavy-tail fit.

    Vietoris-Rips uses at most ``params.max_points`` rows (``default_rng(params.seed)``); the
    shuffled nulls of layer ``index`` use ``default_rng([params.seed, index, ...])``. Returns the
    values, the layer's ``[H0, H1]`` diagrams and the ``w_alpha`` fit (NaN with a reason when the
    layer has too few eigenvalues). ``overwrite``: the caller gives ``weight`` (C-contiguous) away,
    and its buffer becomes the working array of the shuffled nulls once everything that reads the
    layer's arrangement is done; otherwise they work on a copy. Either way the values are the same;
    overwriting is what keeps a streaming worker at one layer plus fixed-size buffers.

    Only the families in ``params.families`` are computed (a weight family that is off costs nothing): the
    others' values are NaN, their ``w_alpha`` fit NaN with the reason :data:`OFF`, and the diagrams empty
    ``(0, 2)`` arrays when ``vr`` is off. Each family's values do not depend on which others are on.
    """
    on = set(params.families)  # a family that is off is not computed: NaN, as switched_off would write it
    off = {name: dict.fromkeys(per_layer(family), np.nan) for name, family in WEIGHT_FAMILIES.items()}
    # Steps in this order hold at most the layer and one of their working sets at a time.
    reads_tree = bool({NP.name, SCALE_FREE.name} & on)
    tree = bipartite_max_spanning_tree(weight) if reads_tree else None  # once: NP, np_excess and np_z read it
    dgms = [np.zeros((0, 2)), np.zeros((0, 2))]
    if VR.name in on:
        rows = subsample_indices(weight.shape[0], params.max_points, params.seed)
        dgms = rips_diagrams(row_distances(weight, rows))
    singular = singular_values(weight) if {SPECTRAL.name, HEAVY_TAIL.name} & on else None
    arranged = off[SCALE_FREE.name]
    if SCALE_FREE.name in on:
        arranged = scale_free_features(weight, tree, params.max_points, params.seed, params.unit_points)
    spectral = named(SPECTRAL, weight_spectrum(weight, singular)) if SPECTRAL.name in on else off[SPECTRAL.name]
    alpha = fit_tail(singular**2) if HEAVY_TAIL.name in on else AlphaFit(np.nan, np.nan, 0, np.nan, OFF)
    values = {**off[NP.name], **(named(VR, diagram_summary(dgms)) if VR.name in on else off[VR.name]), **spectral}
    values |= {name: value for name, value in arranged.items() if name != "np_z"}
    values |= {"np_excess": np.nan, "np_z": arranged["np_z"]}
    if reads_tree:
        # From here on only the layer's entries matter, not their arrangement.
        own = overwrite and _is_scratch(weight)
        work = weight if own else np.array(weight, np.result_type(weight, np.float32), order="C")
    if NP.name in on:
        np_value = tree_persistence(tree, global_max)
        shuffled = shuffled_neural_persistence(work, global_max, [params.seed, index], in_place=True)
        values |= {"np_norm": np_value.np_norm, "np_sum": np_value.np_sum, "np_shuffled_norm": shuffled.np_norm}
    if SCALE_FREE.name in on:
        values["np_excess"] = np_excess(tree, work, params.null_draws, [params.seed, index])
    return values, dgms, alpha


def _is_scratch(weight: np.ndarray) -> bool:
    """Can be shuffled and sorted in place as it is."""
    return weight.dtype in (np.float32, np.float64) and weight.flags.c_contiguous and weight.flags.writeable


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
    "mean_finite": lambda values: values[np.isfinite(values)].mean() if np.isfinite(values).any() else np.nan,
    "mean_std": np.mean,
    "mean": np.mean,
    "sum": np.sum,
    "max": np.max,
    "norm": lambda values: np.sqrt(np.sum(values**2)),
}
