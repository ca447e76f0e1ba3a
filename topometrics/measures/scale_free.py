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
  network-wide max, scaling one layer would change it). The draws start from the layer's sorted
  ``|w|`` entries, so they depend only on their multiset (the same for a row-permuted layer).
* ``np_z``: neural persistence of the per-layer z-scored ``|W|``: each maximum-spanning-tree
  edge persists ``z_max - z_e = (max|w| - |w_e|) / std|w|``; ``np_z`` is their root mean square
  over the ``|V| - 1`` tree edges (the persistence measured in standard deviations of ``|w|``).

Summaries per cloud are :func:`topometrics.measures.persistence.diagram_summary`'s: tp0, tp1, entropy0,
entropy1, count1, maxpers1 over finite bars. Pure functions over arrays.

Invariant (to float64 rounding) to scaling a layer and permuting its rows: ripser's H1 runs in
float32 on the normalised distances, so a scaled copy gives the same float32 input, and the
farthest-point subsample depends on values only. ``vr_fnorm`` shares the plain VR's seeded row
subsample above ``max_points`` rows (by index), so for such layers only scaling is an invariance.
"""

from __future__ import annotations

import numpy as np

from topometrics.measures.neural_persistence import sorted_magnitudes, tree_persistence
from topometrics.measures.persistence import diagram_summary, rips_diagrams, row_distances, subsample_indices
from topometrics.measures.row_blocks import float64_row_blocks, row_block_bounds
from topometrics.measures.spanning_tree import random_arrangement_tree


def farthest_unit_rows(weight: np.ndarray, count: int) -> np.ndarray:
    """At most ``count`` of the layer's unit rows (``w_i / |w_i|``; all-zero rows, dead neurons
    with no direction, are dropped) by greedy farthest-point (max-min) sampling, in the order
    chosen, float64, without a float64 copy of the layer.

    Starts from the unit row farthest from their centroid and repeatedly adds the one farthest
    from those chosen: a deterministic subsample that covers the cloud (every dropped row lies
    within the last chosen distance of a kept one) and depends only on the rows' values, so
    permuting the rows does not change it. Clouds that fit are returned whole.

    For unit vectors ``|u_i - p|^2 = 2 - 2 cos_i`` with ``cos_i = (w_i . p) / |w_i|``, so "farthest
    from the chosen rows" is "smallest largest cosine to them". Each step screens every row with one
    matrix-vector product in the layer's own dtype (BLAS; float32 for a float32 layer), whose cosines are
    within ``delta = (in + 2) eps`` of the float64 ones (the dot product's rounding bound, ``eps`` the
    dtype's unit roundoff); the rows whose screened value lies within ``2 delta`` of the smallest, which
    always include the float64 rule's choice, get their largest cosine to every chosen row in float64, and
    the smallest of those wins (the first row on a tie). So the choice is the float64 rule's; only a near-tie
    (to float64 rounding) may pick another row than the same rule on a matrix of unit rows would.
    """
    w = np.asarray(weight)
    bounds = row_block_bounds(w.shape[0], 8 * w.shape[1])
    norms = np.concatenate([np.linalg.norm(block, axis=1) for _, block in float64_row_blocks(w)])
    kept = np.flatnonzero(norms > 0)
    if kept.size <= count:
        return np.asarray(w[kept], dtype=np.float64) / norms[kept, None]
    inverse = np.zeros(norms.size)
    inverse[kept] = 1.0 / norms[kept]
    screen = w.dtype if w.dtype in (np.float32, np.float64) else np.dtype(np.float64)
    delta = (w.shape[1] + 2) * np.finfo(screen).eps / 2 * 1.01  # eps / 2: the unit roundoff

    def unit(row: int) -> np.ndarray:
        return np.asarray(w[row], dtype=np.float64) / norms[row]

    mean = sum(np.einsum("ij,i->j", w[a:b], inverse[a:b], dtype=np.float64) for a, b in bounds) / kept.size
    centroid = np.concatenate([np.einsum("ij,j->i", w[a:b], mean, dtype=np.float64) for a, b in bounds])
    chosen = [int(np.argmin((centroid * inverse)[kept]))]  # farthest from the centroid: 1 - 2 u.m + |m|^2
    units = [unit(kept[chosen[0]])]
    screened = np.full(kept.size, -np.inf)  # largest screened cosine to a chosen row
    for _ in range(count - 1):
        dots = np.asarray(w @ units[-1].astype(screen), dtype=np.float64)
        screened = np.maximum(screened, (dots * inverse)[kept])
        near = np.flatnonzero(screened <= screened.min() + 2 * delta)
        rows = kept[near]
        exact = (np.asarray(w[rows], dtype=np.float64) @ np.array(units).T).max(axis=1) * inverse[rows]
        chosen.append(int(near[np.argmin(exact)]))
        units.append(unit(kept[chosen[-1]]))
    return np.array(units)


def cloud_summary(dist: np.ndarray, prefix: str) -> tuple[dict[str, float], list[np.ndarray]]:
    """``diagram_summary`` of the VR diagrams of a cloud given by its ``(n, n)`` distances
    (:func:`~topometrics.measures.persistence.row_distances`), keys prefixed (``vr_unit_tp0``, ...); zeros
    for an empty cloud."""
    dgms = rips_diagrams(dist) if dist.shape[0] else [np.empty((0, 2)), np.empty((0, 2))]
    return {f"{prefix}{name}": value for name, value in diagram_summary(dgms).items()}, dgms


def np_excess(tree: np.ndarray, entries: np.ndarray, draws: int, seed: list[int]) -> float:
    """NP of the layer minus the mean NP of ``draws`` shuffled nulls, all with the layer's own ``max|w|``.

    ``tree`` is the layer's :func:`~topometrics.measures.neural_persistence.bipartite_max_spanning_tree`
    (descending, so ``tree[0] = max|w|``). ``entries`` holds the layer's entries in any
    arrangement (C-contiguous, the layer's shape) and is overwritten: ``|w|`` is sorted in it, so a caller
    done with the layer passes the layer itself and no copy is made. Draw ``k`` is the tree of a uniformly
    random arrangement of the sorted ``|w|``, drawn with ``default_rng([*seed, k])``
    (:func:`~topometrics.measures.spanning_tree.random_arrangement_tree`): fixed by the seed and by the
    multiset alone. NaN for an all-zero layer.
    """
    top = float(tree[0])
    if top == 0:
        return np.nan
    observed = tree_persistence(tree, top).np_norm
    descending = sorted_magnitudes(entries)
    null = [
        tree_persistence(random_arrangement_tree(descending, *entries.shape, np.random.default_rng([*seed, k])), top)
        for k in range(draws)
    ]
    return float(observed - np.mean([value.np_norm for value in null]))


def np_zscored(weight: np.ndarray, tree: np.ndarray) -> float:
    """Root-mean-square tree-edge persistence of the z-scored ``|W|`` (NaN when ``|w|`` is constant);
    ``tree`` as for :func:`np_excess`."""
    sd = _abs_std(np.asarray(weight))
    if not sd > 0:
        return np.nan
    return float(np.sqrt(np.mean(((tree[0] - tree) / sd) ** 2)))


def _abs_std(weight: np.ndarray) -> float:
    """Population standard deviation of ``|W|`` in float64, two passes over row blocks."""
    count = weight.size
    mean = sum(float(np.abs(block).sum()) for _, block in float64_row_blocks(weight)) / count
    squares = sum(float(np.square(np.abs(block) - mean).sum()) for _, block in float64_row_blocks(weight))
    return float(np.sqrt(squares / count))


def scale_free_features(
    weight: np.ndarray, tree: np.ndarray, max_points: int, row_seed: int, unit_points: int
) -> dict[str, float]:
    """The scale-free features of one layer that read its arrangement: ``vr_unit_*``, ``vr_fnorm_*``
    and ``np_z`` (``np_excess``, which reads only its entries, is :func:`np_excess`).

    ``tree``: the layer's maximum-spanning-tree values (:func:`np_excess`). ``max_points`` and
    ``row_seed`` pick the ``vr_fnorm`` rows as :func:`topometrics.measures.persistence.subsample_rows` does
    for the plain VR features (the same rows). ``vr_unit`` uses at most ``unit_points`` unit rows
    chosen by :func:`farthest_unit_rows`: unit rows of a near-initial layer are almost equidistant, where
    ripser's H1 costs ~20x more than on the raw rows, so the cloud is kept small. No full-size
    float64 copy of the layer is made, and the unit sample is done before the rows are taken.
    """
    unit, _ = cloud_summary(row_distances(farthest_unit_rows(weight, unit_points)), "vr_unit_")
    norm = float(np.linalg.norm(weight))
    rows = subsample_indices(weight.shape[0], max_points, row_seed)
    fnorm, _ = cloud_summary(row_distances(weight, rows, scale=norm if norm > 0 else 1.0), "vr_fnorm_")
    return {**unit, **fnorm, "np_z": np_zscored(weight, tree)}
