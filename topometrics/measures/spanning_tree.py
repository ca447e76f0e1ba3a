"""Maximum spanning trees of dense graphs, by vectorised Boruvka steps, and of a random arrangement.

Shared by neural persistence (the bipartite graph of a layer, and the contracted graph of its
components; the layer's entries in a uniformly random arrangement, :func:`random_arrangement_tree`)
and Vietoris-Rips H0 (the Euclidean minimum spanning tree is the maximum tree of the negated
distances). Every maximum spanning tree of a graph has the same multiset of edge values, so these
functions return values, not edges, and are exact with ties.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import minimum_spanning_tree

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


def random_arrangement_tree(descending: np.ndarray, n: int, m: int, rng: np.random.Generator) -> np.ndarray:
    """Edge values of a maximum spanning tree of the complete bipartite graph ``K(n, m)`` whose ``n m`` edges carry
    the values ``descending`` (sorted descending) in a uniformly random arrangement: the tree of a layer whose
    entries were shuffled uniformly, without shuffling them.

    Returns the ``(n + m - 1,)`` tree values, descending, float64.

    Kruskal takes the edges in value order, so the tree of any arrangement is decided by where the largest values
    lie: once the first ``K`` ranks span the graph, every smaller edge closes a cycle. Rank ``r`` is given a
    position (edge) drawn uniformly among those the ranks before it left (:func:`random_positions`: the first
    ``K`` ranks of a uniformly random permutation, in distribution), the first ``(n + m)(ln(n + m) + 2)`` of them
    at once (about what a random bipartite graph needs to span), twice as many until they span. Kruskal runs
    on ranks (scipy's ``minimum_spanning_tree``, costs ``1 + rank``), so ties among the values change nothing: the
    tree's values are those of the arrangement whatever order equal values take.
    """
    total = n * m
    if descending.shape != (total,):
        raise ValueError(f"{descending.shape} values for a {n} x {m} layer")
    used, positions = np.zeros(total, dtype=bool), np.empty(0, dtype=np.int64)
    want = min(total, int((n + m) * (np.log(n + m) + 2)))
    while True:
        positions = np.concatenate([positions, random_positions(total, want - positions.size, used, rng)])
        graph = csr_matrix(
            (np.arange(1, positions.size + 1, dtype=np.float64), (positions // m, n + positions % m)),
            shape=(n + m, n + m),
        )
        ranks = np.sort(minimum_spanning_tree(graph).data).astype(np.int64) - 1
        if ranks.size == n + m - 1:  # spans: the smaller ranks can only close cycles
            return descending[ranks].astype(np.float64)
        want = min(total, 2 * want)


def random_positions(total: int, count: int, used: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``count`` distinct positions of ``range(total)`` not yet ``used`` ((total,) bool, marked here), in the order
    drawn: each uniform among the positions the earlier draws (these and before) left, so that consecutive calls
    give ranks a uniformly random injection into positions. Sequential rejection sampling (the first occurrence
    of each fresh candidate is kept); when most positions are taken, the remaining ones shuffled instead."""
    left = total - int(used.sum())
    if count > left:
        raise ValueError(f"{count} positions asked, {left} left")
    if 2 * count >= left:  # rejection would mostly reject: a uniform order of what is left
        rest = rng.permutation(np.flatnonzero(~used))[:count]
        used[rest] = True
        return rest
    drawn = []
    while count > 0:
        candidates = rng.integers(0, total, size=count + count // 4 + 16)
        candidates = candidates[~used[candidates]]
        first = np.sort(np.unique(candidates, return_index=True)[1])
        fresh = candidates[first][:count]
        used[fresh] = True
        drawn.append(fresh)
        count -= fresh.size
    return np.concatenate(drawn) if drawn else np.empty(0, dtype=np.int64)
