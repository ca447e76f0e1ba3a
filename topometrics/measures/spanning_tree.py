"""Maximum spanning trees of dense graphs, by vectorised Boruvka steps.

Shared by neural persistence (the bipartite graph of a layer, and the contracted graph of its
components) and Vietoris-Rips H0 (the Euclidean minimum spanning tree is the maximum tree of the
negated distances). Every maximum spanning tree of a graph has the same multiset of edge values,
so these functions return values, not edges, and are exact with ties.
"""

from __future__ import annotations

import numpy as np

# Up to this many vertices a plain-Python Prim beats a numpy Boruvka step (per-call overhead).
_PRIM_VERTICES = 16


def dense_max_tree(weights: np.ndarray) -> np.ndarray:
    """Edge values of a maximum spanning tree of a complete graph given densely, by Boruvka.

    Parameters
    ----------
    weights : (k, k) symmetric float array
        Finite edge values off the diagonal, ``-inf`` on it.

    Returns
    -------
    (k - 1,) array of edge values (``weights.dtype``), unsorted.

    Notes
    -----
    Each step every vertex takes its largest edge and the components are contracted (the edge
    between two components is the largest between them; parallel smaller edges are never in a
    maximum tree), so there are at most ``log2 k`` steps of vectorised O(k^2) work; the last
    ``_PRIM_VERTICES`` or fewer components are joined by :func:`_python_prim`. A row's
    argmax keeps the first index among ties, which is the choice of the one strict order "value
    descending, then (min(i, j), max(i, j)) ascending": the chosen edges never close a cycle.
    Tree = chosen forest + a maximum tree of the contracted graph, and every maximum spanning
    tree has the same multiset of values, so the result is exact with ties.
    """
    values, roots = [], []
    while weights.shape[0] > _PRIM_VERTICES:
        labels, is_root = boruvka_components(weights.argmax(axis=1))
        values.append(weights.max(axis=1))
        roots.append(is_root)
        k = int(is_root.sum())
        weights = block_max(weights, labels, labels, k)
        weights.flat[:: k + 1] = -np.inf  # the diagonal
    tail = np.array(_python_prim(weights.tolist()), dtype=weights.dtype)
    if not values:
        return tail
    return np.concatenate([np.concatenate(values)[~np.concatenate(roots)], tail])


def _python_prim(rows: list[list[float]]) -> list[float]:
    """Edge values of a maximum spanning tree of a small complete graph, plain-Python Prim.

    ``rows`` is the (k, k) symmetric matrix as lists, ``-inf`` on the diagonal. Any largest
    edge leaving the tree is a tree edge (cut property), so ties need no order.
    """
    best = rows[0]  # largest edge from the tree to each vertex
    remaining = list(range(1, len(rows)))
    values = []
    while remaining:
        j = max(remaining, key=best.__getitem__)
        values.append(best[j])
        remaining.remove(j)
        best = [b if b > r else r for b, r in zip(best, rows[j], strict=True)]
    return values


def boruvka_components(best: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Components of the forest in which every vertex is joined to its chosen neighbour.

    Parameters
    ----------
    best : (V,) int array
        ``best[v]``: the other end of v's largest edge under one strict order of the edges.
        Along these links the edges only grow, so the only cycles are mutual pairs (one edge
        chosen by both ends).

    Returns
    -------
    labels : (V,) int64 array
        Component of each vertex, ``0 .. k-1`` in the order of the roots.
    is_root : (V,) bool array
        One vertex per component (the smaller end of its mutual pair). Every other vertex ``v``
        brings the forest edge ``(v, best[v])``, so there are ``V - k`` distinct forest edges.
    """
    v = np.arange(best.size)
    is_root = (best[best] == v) & (v < best)
    parent = np.where(is_root, v, best)
    # Pointer jumping: after j steps every vertex points 2^j links up (or to its root), and no
    # path is longer than V - 1 links. A fixed count is cheaper than testing for convergence.
    for _ in range((best.size - 1).bit_length()):
        parent = parent[parent]
    return (np.cumsum(is_root) - 1)[parent], is_root


def block_max(matrix: np.ndarray, row_labels: np.ndarray, col_labels: np.ndarray, k: int) -> np.ndarray:
    """``out[a, b] = max matrix[r, c]`` over rows labelled a and columns labelled b, (k, k).

    Every label ``0 .. k-1`` must occur among the rows and among the columns.
    """
    groups = np.arange(k)
    row_order = np.argsort(row_labels)
    col_order = row_order if col_labels is row_labels else np.argsort(col_labels)
    row_starts = np.searchsorted(row_labels[row_order], groups)
    col_starts = row_starts if col_labels is row_labels else np.searchsorted(col_labels[col_order], groups)
    # Rows first: the column gather then runs on the smaller (k, m) matrix.
    rows = np.maximum.reduceat(matrix[row_order], row_starts, axis=0)
    return np.maximum.reduceat(rows[:, col_order], col_starts, axis=1)
