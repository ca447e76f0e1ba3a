"""0-dimensional sublevel-set persistence of a function sampled on a grid, and its summaries.

The filtration is the lower-star filtration of the grid graph: a vertex enters at its value, an edge
when its higher end does. Neighbours are **axis-aligned** (4 in 2-D, 2 in 1-D, 2d in d dimensions),
never diagonal; this is a choice, and it changes answers: on ``[[0, 5], [5, 1]]`` the two minima meet
at 5 under 4-neighbourhood (a saddle, the bar (1, 5)) and never under 8-neighbourhood (one minimum).
It is the ``vertices=`` convention of a cubical complex (gudhi's ``CubicalComplex(vertices=...)``),
not ``top_dimensional_cells=``.

Components merge by the elder rule: the one born later (higher birth; on equal births, the one whose
minimum comes later in flat C order) dies at the merging value. Diagrams are ``(n, 2)`` float64 arrays
of (birth, death) in loss units, the global minimum's bar last with death ``inf``, as in
:mod:`topometrics.measures.persistence`. Ties are broken by flat C order, so equal values never make a
bar of negative length, and a component born and merged at the same value (ties on a plateau) is
left out: a zero-length bar is a point on the diagonal, with no persistence to count.
"""

from __future__ import annotations

import numpy as np

SUMMARY_KEYS = ("minima", "saddles", "tp", "mean_pers", "max_pers", "centre_basin", "range")


def sublevel_diagram(values: np.ndarray) -> np.ndarray:
    """H0 diagram of the lower-star filtration of ``values`` (any shape, axis-aligned neighbours).

    Returns an ``(m, 2)`` array of (birth, death) with birth < death: one bar per local minimum (a
    plateau counts once), the finite ones in the order they die, the global minimum's ``(min, inf)``
    last. Raises ``ValueError`` on a non-finite value (a NaN loss has no place in a filtration; the
    caller records why).
    """
    f = np.asarray(values, dtype=np.float64)
    if f.size == 0 or not np.isfinite(f).all():
        raise ValueError("sublevel persistence needs a non-empty grid of finite values")
    flat = f.ravel()
    order = np.argsort(flat, kind="stable")  # ties by flat C order
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    parent = np.full(flat.size, -1)  # -1: not yet in the filtration
    bars = []
    for v in order:
        parent[v] = v
        for u in _neighbours(v, f.shape):
            if parent[u] < 0:
                continue
            a, b = _root(parent, v), _root(parent, u)
            if a == b:
                continue
            elder, younger = (a, b) if rank[a] < rank[b] else (b, a)  # a root is its component's minimum
            if younger != v and flat[younger] < flat[v]:  # v joining is no birth; a tie makes no bar
                bars.append((flat[younger], flat[v]))
            parent[younger] = elder
    bars.append((flat[order[0]], np.inf))
    return np.asarray(bars, dtype=np.float64).reshape(-1, 2)


def _neighbours(index: int, shape: tuple[int, ...]) -> list[int]:
    coords = np.unravel_index(index, shape)
    found = []
    for axis, size in enumerate(shape):
        for step in (-1, 1):
            c = coords[axis] + step
            if 0 <= c < size:
                moved = list(coords)
                moved[axis] = c
                found.append(int(np.ravel_multi_index(moved, shape)))
    return found


def _root(parent: np.ndarray, v: int) -> int:
    while parent[v] != v:
        parent[v] = parent[parent[v]]  # path halving
        v = parent[v]
    return v


def descent_basins(values: np.ndarray) -> np.ndarray:
    """Label of each grid point's steepest-descent minimum (same shape as ``values``, int).

    Every point moves to its lowest axis-aligned neighbour while that is lower than itself (ties by
    flat C order); points that end at the same minimum share its flat index as their label.
    """
    f = np.asarray(values, dtype=np.float64)
    flat = f.ravel()
    key = np.lexsort((np.arange(flat.size), flat))
    rank = np.empty_like(key)
    rank[key] = np.arange(key.size)  # a strict total order: value, then flat index
    target = np.arange(flat.size)
    for v in range(flat.size):
        lower = [u for u in _neighbours(v, f.shape) if rank[u] < rank[target[v]]]
        if lower:
            target[v] = min(lower, key=lambda u: rank[u])
    labels = target.copy()
    while not np.array_equal(labels, target[labels]):
        labels = target[labels]
    return labels.reshape(f.shape)


def slice_summary(values: np.ndarray) -> dict[str, float]:
    """The loss slice's topology (:data:`SUMMARY_KEYS`), for a grid whose centre is the weights.

    ``minima``: bars (local minima); ``saddles``: finite bars (merges); ``tp``, ``mean_pers``,
    ``max_pers``: total, mean and largest persistence of the finite bars (loss units, 0 without any);
    ``centre_basin``: share of the grid whose steepest descent ends where the centre's does;
    ``range``: max - min of the slice (loss units). Invariant to adding a constant to the loss.
    """
    f = np.asarray(values, dtype=np.float64)
    diagram = sublevel_diagram(f)
    pers = diagram[:-1, 1] - diagram[:-1, 0]
    basins = descent_basins(f)
    centre = basins[tuple(s // 2 for s in f.shape)]
    return {
        "minima": float(len(diagram)),
        "saddles": float(len(pers)),
        "tp": float(pers.sum()),
        "mean_pers": float(pers.mean()) if len(pers) else 0.0,
        "max_pers": float(pers.max()) if len(pers) else 0.0,
        "centre_basin": float(np.mean(basins == centre)),
        "range": float(f.max() - f.min()),
    }
