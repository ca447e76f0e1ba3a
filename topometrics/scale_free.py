"""Scale-free topological features of a weight matrix: unchanged when the layer is scaled or its rows permuted.

Within one training run every quantity that grows with the weights tracks the loss, so the plain
total persistence of weight rows (in weight units) and neural persistence (which mostly reads
the weights' spread, Girrbach et al. 2023) cannot separate topology from scale. These features
remove the scale first:

* ``vr_unit_*``: Vietoris-Rips H0/H1 of the **row-normalised** rows (each output neuron's
  incoming vector scaled to unit length): the geometry of directions, distances are chords
  ``sqrt(2 - 2 cos)`` in ``[0, 2]``; at most ``unit_points`` rows, by farthest-point sampling.
* ``vr_fnorm_*``: Vietoris-Rips H0/H1 of the layer divided by its Frobenius norm (the whole
  layer's shape, one scale removed).
* ``np_excess``: neural persistence minus the mean of a shuffled null over ``draws`` seeded
  draws, both with the layer's own ``max |w|`` (so the layer's scale cancels; with the
  network-wide max, scaling one layer would change it). The null permutes the layer's sorted
  ``|w|`` entries, so it depends only on their multiset (the same for a row-permuted layer).
* ``np_z``: neural persistence of the per-layer z-scored ``|W|``: each maximum-spanning-tree
  edge persists ``z_max - z_e = (max|w| - |w_e|) / std|w|``; ``np_z`` is their root mean square
  over the ``|V| - 1`` tree edges (the persistence measured in standard deviations of ``|w|``).

Summaries per cloud are :func:`topometrics.persistence.diagram_summary`'s: tp0, tp1, entropy0,
entropy1, count1, maxpers1 over finite bars. Pure functions over arrays.

Invariant (to float64 rounding) to scaling a layer and permuting its rows: ripser's H1 runs in
float32 on the normalised distances, so a scaled copy gives the same float32 input, and the
farthest-point subsample depends on values only. ``vr_fnorm`` shares the plain VR's seeded row
subsample above ``max_points`` rows (by index), so for such layers only scaling is an invariance.
"""

from __future__ import annotations

import numpy as np

from topometrics.neural_persistence import bipartite_max_spanning_tree, neural_persistence
from topometrics.persistence import diagram_summary, subsample_rows, vietoris_rips_diagrams

VR_SUMMARY = ("tp0", "tp1", "entropy0", "entropy1", "count1", "maxpers1")
UNIT_FEATURES = tuple(f"vr_unit_{name}" for name in VR_SUMMARY)
FNORM_FEATURES = tuple(f"vr_fnorm_{name}" for name in VR_SUMMARY)
NP_FEATURES = ("np_excess", "np_z")
FEATURES = UNIT_FEATURES + FNORM_FEATURES + NP_FEATURES


def unit_rows(weight: np.ndarray) -> np.ndarray:
    """Rows scaled to unit Euclidean length; all-zero rows (dead neurons, no direction) are dropped."""
    w = np.asarray(weight, dtype=np.float64)
    norms = np.linalg.norm(w, axis=1)
    keep = norms > 0
    return w[keep] / norms[keep, None]


def farthest_points(points: np.ndarray, count: int) -> np.ndarray:
    """At most ``count`` rows by greedy farthest-point (max-min) sampling, in the order chosen.

    Starts from the row farthest from the centroid and repeatedly adds the row
    farthest from those chosen: a deterministic subsample that covers the cloud (every dropped row
    lies within the last chosen distance of a kept one) and depends only on the rows' values, so
    permuting the rows does not change it. Clouds that fit are returned whole.
    """
    points = np.asarray(points, dtype=np.float64)
    if points.shape[0] <= count:
        return points
    centred = points - points.mean(axis=0)
    chosen = [int(np.argmax(np.einsum("ij,ij->i", centred, centred)))]
    gap = np.linalg.norm(points - points[chosen[0]], axis=1)
    for _ in range(count - 1):
        chosen.append(int(np.argmax(gap)))
        gap = np.minimum(gap, np.linalg.norm(points - points[chosen[-1]], axis=1))
    return points[chosen]


def fnorm_scaled(weight: np.ndarray) -> np.ndarray:
    """The layer divided by its Frobenius norm (returned unchanged when it is all zero)."""
    w = np.asarray(weight, dtype=np.float64)
    norm = np.linalg.norm(w)
    return w / norm if norm > 0 else w


def cloud_summary(points: np.ndarray, prefix: str) -> tuple[dict[str, float], list[np.ndarray]]:
    """``diagram_summary`` of a cloud's VR diagrams, keys prefixed (``vr_unit_tp0``, ...); zeros for an empty cloud."""
    if points.shape[0] == 0:
        return {f"{prefix}{name}": 0.0 for name in VR_SUMMARY}, [np.empty((0, 2)), np.empty((0, 2))]
    dgms = vietoris_rips_diagrams(points)
    return {f"{prefix}{name}": value for name, value in diagram_summary(dgms).items()}, dgms


def np_excess(weight: np.ndarray, draws: int, seed: list[int]) -> float:
    """NP of the layer minus the mean NP of ``draws`` shuffled nulls, all with the layer's own ``max|w|``.

    Draw ``k`` permutes ``sort(|W|.ravel())`` with ``default_rng([*seed, k])``. NaN for an all-zero layer.
    """
    a = np.abs(np.asarray(weight, dtype=np.float64))
    top = float(a.max()) if a.size else 0.0
    if top == 0:
        return np.nan
    observed = neural_persistence(a, top).np_norm
    values = np.sort(a.ravel())
    null = [
        neural_persistence(np.random.default_rng([*seed, k]).permutation(values).reshape(a.shape), top).np_norm
        for k in range(draws)
    ]
    return float(observed - np.mean(null))


def np_zscored(weight: np.ndarray) -> float:
    """Root-mean-square tree-edge persistence of the z-scored ``|W|`` (NaN when ``|w|`` is constant)."""
    a = np.abs(np.asarray(weight, dtype=np.float64))
    sd = a.std()
    if not sd > 0:
        return np.nan
    tree = bipartite_max_spanning_tree(a)  # descending; tree[0] = max |w|
    return float(np.sqrt(np.mean(((tree[0] - tree) / sd) ** 2)))


def scale_free_features(
    weight: np.ndarray, max_points: int, row_seed: int, null_seed: list[int], draws: int, unit_points: int
) -> dict[str, float]:
    """Every scale-free feature of one layer (:data:`FEATURES`); NaN only for an all-zero or constant layer.

    ``max_points`` and ``row_seed`` pick the ``vr_fnorm`` rows as :func:`topometrics.persistence.subsample_rows`
    does for the plain VR features (the same rows). ``vr_unit`` uses at most ``unit_points`` unit rows
    chosen by :func:`farthest_points`: unit rows of a near-initial layer are almost equidistant, where
    ripser's H1 costs ~20x more than on the raw rows, so the cloud is kept small. ``null_seed`` and
    ``draws`` drive :func:`np_excess`.
    """
    rows = subsample_rows(np.asarray(weight, dtype=np.float64), max_points, row_seed)
    unit, _ = cloud_summary(farthest_points(unit_rows(weight), unit_points), "vr_unit_")
    norm = np.linalg.norm(weight)
    fnorm, _ = cloud_summary(rows / norm if norm > 0 else rows, "vr_fnorm_")
    return {**unit, **fnorm, "np_excess": np_excess(weight, draws, null_seed), "np_z": np_zscored(weight)}


def aggregate(per_layer: dict[str, dict[str, float]]) -> dict[str, float]:
    """The ``layer='all'`` values: VR sums (max for ``maxpers1``), NP means over the layers with a value."""
    out = {}
    for name in UNIT_FEATURES + FNORM_FEATURES:
        col = np.array([v[name] for v in per_layer.values()], dtype=float)
        out[name] = col.max() if name.endswith("maxpers1") else col.sum()
    for name in NP_FEATURES:
        col = np.array([v[name] for v in per_layer.values()], dtype=float)
        col = col[np.isfinite(col)]
        out[name] = col.mean() if col.size else np.nan
    return out
