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
from topometrics.vocabulary import SPECTRAL, VR, lookup, named


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
    """
    # Steps in this order hold at most the layer and one of their working sets at a time.
    tree = bipartite_max_spanning_tree(weight)  # once: NP, np_excess and np_z all read it
    rows = subsample_indices(weight.shape[0], params.max_points, params.seed)
    dgms = rips_diagrams(row_distances(weight, rows))
    singular = singular_values(weight)
    arranged = scale_free_features(weight, tree, params.max_points, params.seed, params.unit_points)
    spectral, alpha = weight_spectrum(weight, singular), fit_tail(singular**2)
    # From here on only the layer's entries matter, not their arrangement.
    own = overwrite and _is_scratch(weight)
    work = weight if own else np.array(weight, np.result_type(weight, np.float32), order="C")
    np_value = tree_persistence(tree, global_max)
    shuffled = shuffled_neural_persistence(work, global_max, [params.seed, index], in_place=True)
    values = {
        "np_norm": np_value.np_norm,
        "np_sum": np_value.np_sum,
        "np_shuffled_norm": shuffled.np_norm,
        **named(VR, diagram_summary(dgms)),
        **named(SPECTRAL, spectral),
        **{name: value for name, value in arranged.items() if name != "np_z"},
        "np_excess": np_excess(tree, work, params.null_draws, [params.seed, index]),
        "np_z": arranged["np_z"],
    }
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
