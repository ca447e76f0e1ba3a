"""Persistent homology of weights and hidden states: pure functions over arrays.

Diagram convention (ripser/persim): a diagram is an ``(n, 2)`` float array of
``(birth, death)`` rows, one array per homology dimension.

Infinite bars, the one rule
---------------------------
A Vietoris-Rips filtration of a non-empty cloud has exactly one essential class, the
H0 bar ``[0, inf)``. :func:`vietoris_rips_diagrams` returns it (ripser's convention), and
every summary, distance and stored table *excludes* it: total persistence, entropy,
counts, significance and the diagram distances use finite bars only (persim would drop
it silently with a warning; here it is dropped explicitly by :func:`finite_bars`).
Only the Betti curve counts it, so ``betti0 >= 1`` at every scale.

Neural persistence (Rieck et al. 2019) uses a different filtration (descending edge
values of one layer's bipartite graph) and is summarised by :func:`neural_persistence`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.sparse import coo_matrix, csr_matrix
from scipy.sparse.csgraph import connected_components, maximum_bipartite_matching, minimum_spanning_tree
from scipy.spatial.distance import pdist, squareform

try:
    # ripser's compiled core, which ripser.ripser() wraps. The wrapper module imports
    # scikit-learn (for pairwise_distances, unused here): ~1 s per process, paid again by
    # every worker; tests check that both give the same diagrams.
    from pyRipser import doRipsFiltrationDM as _rips_filtration
except ImportError:  # a ripser build without the top-level core module
    _rips_filtration = None

# ---------------------------------------------------------------------------
# Neural persistence: maximum spanning tree of a complete bipartite graph
# ---------------------------------------------------------------------------

# Below this many edges, sorting everything is cheaper than the banded algorithm's overhead.
_SMALL_LAYER_EDGES = 1 << 15
# Edges kept in the Kruskal band per vertex; ~4 spans a Gaussian 2048x8192 layer in one go.
_BAND_PER_VERTEX = 4
# Up to this many vertices without a band edge, their argmax is taken one by one.
_FEW_LOW_VERTICES = 64
# Up to this many column groups, the contraction masks columns instead of gathering them.
_FEW_GROUPS = 16
# Bytes of |W| processed at a time, so abs and the band test share cache-resident data.
_BLOCK_BYTES = 1 << 21
# Up to this many vertices a plain-Python Prim beats a numpy Boruvka step (per-call overhead).
_PRIM_VERTICES = 16


_NON_FINITE = "layer has NaN/Inf weights; neural persistence is undefined (treat the checkpoint as diverged)"


class NeuralPersistence(NamedTuple):
    np_norm: float  # reference normalisation: sqrt(sum (1-a_e)^2 + 1) / sqrt(|V| - 1)
    np_sum: float  # seed paper eq. 1: sum (1-a_e) / (|V| - 1)


def bipartite_max_spanning_tree(weight: np.ndarray) -> np.ndarray:
    """Edge values of a maximum spanning tree of the complete bipartite graph of a layer.

    The graph has one vertex per row and per column of ``weight`` and one edge per entry,
    valued ``|w|``. Every maximum spanning tree has the same multiset of edge values, so the
    result is unique even with ties.

    Parameters
    ----------
    weight : (n, m) array
        Finite weights; rows are output neurons, columns input neurons.

    Returns
    -------
    (n + m - 1,) float64 array
        ``|w|`` of the tree edges, sorted in descending order (the H0 deaths of the
        descending filtration, before normalisation).

    Notes
    -----
    Exact without sorting the ``n*m`` edges. Layers of at most ``_SMALL_LAYER_EDGES`` entries
    (every layer of the default ladder) take a dense vectorised Boruvka
    (:func:`_small_layer_tree_values`). Larger ones break ties by a strict order (value
    descending, then row-major flat index ascending) under which the tree is unique:

    1. one blocked pass over ``|W|`` collects the *band*, the edges with value ``>= t``, where
       ``t`` is estimated from a grid sample so the band holds about ``4 (n + m)`` edges; the
       band is a prefix of the strict order;
    2. by the cut property every vertex's largest edge is a tree edge. For a vertex with no
       band edge it lies below ``t`` and is merged first (argmax takes the first index among
       ties: the smallest flat index for a row and for a column alike, consistent with the
       strict order, so these edges never close a cycle); vertices with a band edge get
       theirs from the band. Kruskal then runs over the band in strict order (scipy's
       ``minimum_spanning_tree`` on integer ranks, so no float ties are introduced) and
       accepts exactly the tree edges ``>= t``;
    3. if that forest does not span, the remaining ``k`` components are contracted: one more
       blocked pass finds the largest edge between every pair of components and Prim's
       algorithm on that dense ``k x k`` graph finishes the tree exactly (tree = forest + a
       maximum spanning tree of the contracted graph).

    Zero entries are ordinary edges of value 0. A layer whose entries are almost all equal
    makes the band the whole layer; the result stays exact, only slower.
    """
    a = _validated_layer(weight)
    n, m = a.shape
    if n * m <= _SMALL_LAYER_EDGES:
        return np.sort(_small_layer_tree_values(a))[::-1]
    band = _band(a, _band_threshold(a, _BAND_PER_VERTEX * (n + m)))
    forced = _forced_edges(a, band)
    forest = _kruskal(a, band, forced)
    if forest.size == n + m - 1:
        return np.sort(np.abs(a.ravel()[forest]).astype(np.float64))[::-1]
    values = np.abs(a.ravel()[forest]).astype(np.float64)
    row_labels, col_labels = _component_labels(forest, n, m)
    values = np.concatenate([values, _contracted_tree_values(a, row_labels, col_labels)])
    return np.sort(values)[::-1]


def neural_persistence(weight: np.ndarray, global_max: float) -> NeuralPersistence:
    """Neural persistence of one linear layer (Rieck et al. 2019, seed paper eq. 1).

    Parameters
    ----------
    weight : (n, m) array
        The layer's weight matrix (biases excluded).
    global_max : float
        ``max |w|`` over all linear layers of the network at this checkpoint; edge values
        are ``a = |w| / global_max`` in ``[0, 1]``. If it is 0 (an all-zero network) every
        ``a`` is taken as 0.

    Returns
    -------
    NeuralPersistence
        ``np_norm = sqrt(sum_e (1 - a_e)^2 + 1) / sqrt(|V| - 1)`` (the 2-norm of the H0
        diagram including the essential class ``(1, 0)``, divided by the reference
        implementation's bound) and ``np_sum = sum_e (1 - a_e) / (|V| - 1)``, both over the
        ``|V| - 1 = n + m - 1`` tree edges. A zero edge has persistence 1.
    """
    if not np.isfinite(global_max) or global_max < 0:
        raise ValueError(f"global_max must be a finite non-negative number, got {global_max!r}")
    tree = bipartite_max_spanning_tree(weight)
    scale = 1.0 / global_max if global_max > 0 else 0.0
    pers = 1.0 - np.clip(tree * scale, 0.0, 1.0)
    edges = tree.size  # |V| - 1
    np_norm = float(np.sqrt((np.sum(pers**2) + 1.0) / edges))
    return NeuralPersistence(np_norm=np_norm, np_sum=float(pers.sum() / edges))


def shuffled_neural_persistence(weight: np.ndarray, global_max: float, seed: int | list[int]) -> NeuralPersistence:
    """Neural persistence after a seeded permutation of the layer's entries (a null model).

    Same multiset of weights, so the same spread and the same ``global_max``; only the
    arrangement changes. ``seed`` goes to ``np.random.default_rng`` (an int or a list of
    ints, e.g. ``[seed, layer_index]``), so the result is deterministic.
    """
    a = _validated_layer(weight)
    shuffled = np.random.default_rng(seed).permutation(a.ravel()).reshape(a.shape)
    return neural_persistence(shuffled, global_max)


def _small_layer_tree_values(a: np.ndarray) -> np.ndarray:
    """Maximum-spanning-tree edge values of a small layer's bipartite graph, by dense Boruvka.

    Parameters
    ----------
    a : (n, m) finite float array

    Returns
    -------
    (n + m - 1,) float64 array of ``|a|`` tree values, unsorted.

    Notes
    -----
    Replaces sorting all ``n*m`` edges plus scipy's Kruskal, whose validation and CSR
    construction dominated on layers of a few thousand entries. One step on the bipartite
    graph (every row and column takes its largest edge; argmax keeps the first index among
    ties, i.e. the smallest flat index for rows and columns alike, one strict order), then
    :func:`_dense_max_tree` on the complete graph of the resulting components.
    """
    w = np.abs(a)
    n, m = w.shape
    # Vertices 0..n-1 are rows, n..n+m-1 columns.
    best = np.concatenate([n + w.argmax(axis=1), w.argmax(axis=0)])
    value = np.concatenate([w.max(axis=1), w.max(axis=0)])
    labels, is_root = _boruvka_components(best)
    # Every component holds a row and a column (each vertex joined one of the other side), so
    # every block is non-empty; the edge between two components is the larger way round.
    between = _block_max(w, labels[:n], labels[n:], int(is_root.sum()))
    between = np.maximum(between, between.T)
    np.fill_diagonal(between, -np.inf)
    return np.concatenate([value[~is_root], _dense_max_tree(between)]).astype(np.float64)


def _dense_max_tree(weights: np.ndarray) -> np.ndarray:
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
        labels, is_root = _boruvka_components(weights.argmax(axis=1))
        values.append(weights.max(axis=1))
        roots.append(is_root)
        k = int(is_root.sum())
        weights = _block_max(weights, labels, labels, k)
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


def _boruvka_components(best: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def _block_max(matrix: np.ndarray, row_labels: np.ndarray, col_labels: np.ndarray, k: int) -> np.ndarray:
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


def _validated_layer(weight: np.ndarray) -> np.ndarray:
    a = np.asarray(weight)
    if a.ndim != 2 or a.size == 0:
        raise ValueError(f"a layer must be a non-empty 2-D (out, in) array, got shape {a.shape}")
    a = a if a.dtype in (np.float32, np.float64) else a.astype(np.float64)
    # Large layers are checked inside the band pass instead, saving a pass over memory.
    if a.size <= _SMALL_LAYER_EDGES and not np.isfinite(a).all():
        raise ValueError(_NON_FINITE)
    return a


def _band_threshold(a: np.ndarray, band_size: int) -> float:
    """Estimate the value above which about ``band_size`` entries of ``|a|`` lie.

    A deterministic grid sample of ~65k entries; only speed depends on this estimate,
    never exactness (a band that does not span is finished by contraction).
    """
    n, m = a.shape
    rows = np.linspace(0, n - 1, min(n, 256)).astype(np.int64)
    cols = np.linspace(0, m - 1, min(m, max(1, 65536 // rows.size))).astype(np.int64)
    sample = np.abs(a[np.ix_(rows, cols)]).ravel()
    keep = max(1, int(round(sample.size * band_size / (n * m))))
    return float(np.partition(sample, sample.size - keep)[sample.size - keep])


def _row_blocks(a: np.ndarray):
    """Yield ``(start, |a[start:stop]|)`` for cache-sized row blocks (the buffer is reused)."""
    n, m = a.shape
    step = max(1, _BLOCK_BYTES // (a.itemsize * m))
    buf = np.empty((min(step, n), m), dtype=a.dtype)
    for start in range(0, n, step):
        block = buf[: min(step, n - start)]
        np.abs(a[start : start + block.shape[0]], out=block)
        yield start, block


def _band(a: np.ndarray, t: float) -> np.ndarray:
    """Sorted flat indices of the entries with ``|a| >= t``, in one blocked pass.

    Also the finiteness check: the block maximum propagates NaN and shows Inf.
    """
    m = a.shape[1]
    parts = []
    for start, block in _row_blocks(a):
        if not np.isfinite(block.max()):
            raise ValueError(_NON_FINITE)
        parts.append(np.flatnonzero(block >= t) + start * m)
    return np.concatenate(parts).astype(np.int64, copy=False)


def _forced_edges(a: np.ndarray, band: np.ndarray) -> np.ndarray:
    """Sorted flat indices of the largest edge of every vertex that has no edge in the band.

    Ties go to the first index: for a row the smallest column, for a column the smallest row,
    i.e. the smallest flat index either way, consistent with the strict order.
    """
    n, m = a.shape
    low_rows = np.flatnonzero(np.bincount(band // m, minlength=n) == 0)
    low_cols = np.flatnonzero(np.bincount(band % m, minlength=m) == 0)
    if low_rows.size == 0 and low_cols.size == 0:
        return np.empty(0, dtype=np.int64)
    if low_rows.size + low_cols.size <= _FEW_LOW_VERTICES:
        rows = np.abs(a[low_rows]).argmax(axis=1)
        block = np.abs(a[:, low_cols])  # (n, few)
        # argmax along axis 0 copies transposed (slow); the first row-major hit of each
        # column's maximum is its first maximal row.
        hit_rows, hit_cols = np.nonzero(block == block.max(axis=0, initial=0))
        cols = hit_rows[np.unique(hit_cols, return_index=True)[1]]
    else:
        rows, cols = _low_vertex_pass(a, low_rows, low_cols)
    edges = np.concatenate([low_rows * m + rows, np.asarray(cols, dtype=np.int64) * m + low_cols])
    return np.unique(edges.astype(np.int64))


def _low_vertex_pass(a: np.ndarray, low_rows: np.ndarray, low_cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Argmax of |a| over the given rows (along columns) and columns (along rows), blocked.

    Fancy-indexing columns out of a row-major matrix costs a cache line per element, so the
    column argmax keeps a running maximum over row blocks instead; a strictly larger block
    maximum replaces it (so the first row wins ties), its row is the first hit of the block
    maximum in that column.
    """
    m = a.shape[1]
    row_arg = np.empty(low_rows.size, dtype=np.int64)
    col_best = np.full(m, -1.0, dtype=a.dtype)
    col_arg = np.zeros(m, dtype=np.int64)
    is_low_col = np.zeros(m, dtype=bool)
    is_low_col[low_cols] = True
    for start, block in _row_blocks(a):
        stop = start + block.shape[0]
        lo, hi = np.searchsorted(low_rows, [start, stop])
        row_arg[lo:hi] = block[low_rows[lo:hi] - start].argmax(axis=1)
        block_max = block.max(axis=0)
        improved = np.flatnonzero((block_max > col_best) & is_low_col)
        if improved.size:
            hit_rows, hit_cols = np.nonzero(block[:, improved] == block_max[improved])
            first = np.unique(hit_cols, return_index=True)[1]
            col_arg[improved] = start + hit_rows[first]
            col_best[improved] = block_max[improved]
    return row_arg, col_arg[low_cols]


def _strict_order(values: np.ndarray) -> np.ndarray:
    """Positions sorting ``values`` descending, ties by position (= flat index) ascending."""
    if values.dtype == np.float32 and values.size < 1 << 32:
        # Non-negative float32 bit patterns are ordered like the values, so one int sort of
        # (inverted bits, position) does it; 3-4x faster than a stable argsort.
        key = (~values.view(np.uint32)).astype(np.uint64) << np.uint64(32)
        key |= np.arange(values.size, dtype=np.uint64)
        return (np.sort(key) & np.uint64(0xFFFFFFFF)).astype(np.int64)
    return np.argsort(-values, kind="stable")


def _kruskal(a: np.ndarray, band: np.ndarray, forced: np.ndarray) -> np.ndarray:
    """Flat indices of the forest: the forced edges, then Kruskal over the band in strict order."""
    n, m = a.shape
    band_rank = np.empty(band.size)
    band_rank[_strict_order(np.abs(a.ravel()[band]))] = np.arange(forced.size + 1, forced.size + band.size + 1)
    # Forced edges lie below the band, so they are disjoint from it; they get the smallest
    # costs (Kruskal takes them first). Costs are ranks >= 1 because scipy reads 0 as "no edge".
    at = np.searchsorted(band, forced)
    flat = np.insert(band, at, forced)
    cost = np.insert(band_rank, at, np.arange(1, forced.size + 1, dtype=np.float64))
    # flat is sorted, i.e. grouped by row with increasing columns: build the CSR directly.
    indptr = np.zeros(n + m + 1, dtype=np.int64)
    indptr[1 : n + 1] = np.cumsum(np.bincount(flat // m, minlength=n))
    indptr[n + 1 :] = indptr[n]
    graph = csr_matrix((cost, n + flat % m, indptr), shape=(n + m, n + m))
    tree = minimum_spanning_tree(graph).tocoo()
    return flat[np.searchsorted(flat, tree.row.astype(np.int64) * m + (tree.col - n))]


def _component_labels(forest: np.ndarray, n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    graph = coo_matrix((np.ones(forest.size), (forest // m, n + forest % m)), shape=(n + m, n + m))
    _, labels = connected_components(graph, directed=False)
    return labels[:n], labels[n:]


def _contracted_tree_values(a: np.ndarray, row_labels: np.ndarray, col_labels: np.ndarray) -> np.ndarray:
    """Maximum-spanning-tree edge values of the graph whose vertices are forest components.

    The edge between components i and j is the largest ``|a[r, c]|`` with r, c in i, j (either
    way round); parallel smaller edges can never be in a maximum spanning tree.
    """
    k = int(max(row_labels.max(), col_labels.max())) + 1
    col_groups = np.unique(col_labels)
    per_row = np.empty((a.shape[0], col_groups.size))  # (n, column groups)
    if col_groups.size <= _FEW_GROUPS:
        # Entries are >= 0 and every group is non-empty, so zeroing the other columns
        # leaves each group's maximum intact; cheaper than gathering columns.
        masks = (col_labels[None, :] == col_groups[:, None]).astype(a.dtype)
        for start, block in _row_blocks(a):
            for g, mask in enumerate(masks):
                per_row[start : start + block.shape[0], g] = (block * mask).max(axis=1)
    else:
        col_order = np.argsort(col_labels, kind="stable")
        col_starts = np.searchsorted(col_labels[col_order], col_groups)
        for start, block in _row_blocks(a):
            per_row[start : start + block.shape[0]] = np.maximum.reduceat(block[:, col_order], col_starts, axis=1)
    row_order = np.argsort(row_labels, kind="stable")
    row_groups, row_starts = np.unique(row_labels[row_order], return_index=True)
    per_pair = np.maximum.reduceat(per_row[row_order], row_starts, axis=0)  # (row groups, column groups)
    between = np.full((k, k), -1.0)  # -1: no edge between these components
    between[np.ix_(row_groups, col_groups)] = per_pair
    between = np.maximum(between, between.T)
    np.fill_diagonal(between, -1.0)
    return _prim_max_tree(between)


def _prim_max_tree(between: np.ndarray) -> np.ndarray:
    """Edge values of a maximum spanning tree of a dense graph (-1 marks a missing edge)."""
    k = between.shape[0]
    in_tree = np.zeros(k, dtype=bool)
    in_tree[0] = True
    best = between[0].copy()
    values = np.empty(k - 1)
    for i in range(k - 1):
        j = int(np.argmax(np.where(in_tree, -np.inf, best)))
        if best[j] < 0:
            raise RuntimeError("contracted graph is disconnected; a component has no rows or no columns")
        values[i] = best[j]
        in_tree[j] = True
        np.maximum(best, between[j], out=best)
    return values


# ---------------------------------------------------------------------------
# Vietoris-Rips diagrams and their summaries
# ---------------------------------------------------------------------------


def subsample_rows(points: np.ndarray, max_points: int, seed: int) -> np.ndarray:
    """At most ``max_points`` rows, drawn without replacement with ``default_rng(seed)``.

    Clouds that already fit are returned whole and in order (no randomness involved); the
    chosen rows keep their original order. The same seed picks the same row indices at every
    checkpoint, so consecutive diagrams describe the same neurons.
    """
    points = np.asarray(points)
    if max_points <= 0:
        raise ValueError(f"max_points must be positive, got {max_points}")
    if points.shape[0] <= max_points:
        return points
    idx = np.sort(np.random.default_rng(seed).choice(points.shape[0], max_points, replace=False))
    return points[idx]


def vietoris_rips_diagrams(points: np.ndarray) -> list[np.ndarray]:
    """Vietoris-Rips H0 and H1 diagrams of a point cloud, with no filtration threshold.

    Parameters
    ----------
    points : (n, d) array
        Euclidean point cloud (n >= 1).

    Returns
    -------
    [H0, H1] : list of (k, 2) float64 arrays
        H0 is exact in float64: bars ``(0, e)`` for the edges ``e > 0`` of the Euclidean
        minimum spanning tree of the *distinct* points, in ascending order, plus the essential
        bar ``(0, inf)``. Duplicate points are removed first: they only add zero-length bars,
        which ripser does not report either. H1 comes from ripser (maxdim=1, no threshold) on
        the same distances, in ripser's order (births descending); ripser computes in float32,
        so H1 values carry float32 rounding. Fewer than 4 distinct points have no H1.
    """
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2 or points.shape[0] == 0:
        raise ValueError(f"points must be a non-empty (n, d) array, got shape {points.shape}")
    if not np.isfinite(points).all():
        raise ValueError("points contain NaN/Inf; Vietoris-Rips is undefined")
    condensed = pdist(points)
    dist = squareform(condensed)
    if not condensed.all():  # rare, so the common case skips np.unique's row sort
        keep = ~np.triu(dist == 0, k=1).any(axis=0)  # drop every point equal to an earlier one
        dist = dist[np.ix_(keep, keep)]
    if dist.shape[0] == 1:
        return [np.array([[0.0, np.inf]]), np.empty((0, 2))]
    tree = np.sort(euclidean_mst_lengths(dist))
    h0 = np.concatenate([np.column_stack([np.zeros(tree.size), tree]), [[0.0, np.inf]]])
    if dist.shape[0] < 4:
        return [h0, np.empty((0, 2))]
    return [h0, _ripser_h1(dist)]


def euclidean_mst_lengths(dist: np.ndarray) -> np.ndarray:
    """Edge lengths of a minimum spanning tree of a complete graph, unsorted.

    Parameters
    ----------
    dist : (n, n) symmetric float64 array
        Distances, positive off the diagonal (n >= 1).

    Returns
    -------
    (n - 1,) float64 array: the same multiset as ``scipy.sparse.csgraph.minimum_spanning_tree``
    would give, exactly (values are entries of ``dist``), via the dense vectorised Boruvka of
    :func:`_dense_max_tree` on ``-dist``; on clouds of ~200 points it skips scipy's dense-to-CSR
    conversion and edge sort, ~20x faster.
    """
    weights = -dist
    np.fill_diagonal(weights, -np.inf)
    return -_dense_max_tree(weights)


def _ripser_h1(dist: np.ndarray) -> np.ndarray:
    """ripser's H1 diagram of a distance matrix (n >= 4), exactly as ``ripser.ripser`` returns it, (k, 2).

    Points are handed to ripser in descending order of their summed distance: the diagram does
    not depend on the order, but ripser finds more apparent pairs with far points first (~20%
    faster on the weight clouds). ripser lists bars by birth descending, equal births by its
    edge numbering, which the reordering changes; so the bars are sorted back by birth, and in
    the rare case of equal (float32) births ripser runs again on the original order.
    """
    order = np.argsort(-dist.sum(axis=1), kind="stable")
    h1 = _ripser_diagrams(dist[np.ix_(order, order)])[1]
    h1 = h1[np.argsort(-h1[:, 0], kind="stable")]
    if np.any(h1[1:, 0] == h1[:-1, 0]):
        h1 = _ripser_diagrams(dist)[1]
    return h1


def _ripser_diagrams(dist: np.ndarray) -> list[np.ndarray]:
    """``ripser(dist, maxdim=1, distance_matrix=True)["dgms"]`` for a zero-diagonal distance matrix.

    Calls the compiled core with the same arguments as the wrapper (the strict upper triangle,
    row by row, in float32; no threshold; Z/2 coefficients; no cocycles). Returns ``[H0, H1]``,
    each a (k, 2) float64 array.
    """
    if _rips_filtration is None:
        from ripser import ripser

        return [
            np.asarray(d, dtype=np.float64).reshape(-1, 2) for d in ripser(dist, maxdim=1, distance_matrix=True)["dgms"]
        ]
    upper = squareform(dist, checks=False).astype(np.float32)  # the upper triangle, row by row
    result = _rips_filtration(upper, 1, np.inf, 2, False)
    return [np.asarray(d, dtype=np.float64).reshape(-1, 2) for d in result["births_and_deaths_by_dim"]]


def finite_bars(diagram: np.ndarray) -> np.ndarray:
    """The bars of a diagram with finite death (the infinite-bar rule: essential classes go)."""
    diagram = np.asarray(diagram, dtype=np.float64).reshape(-1, 2)
    return diagram[np.isfinite(diagram[:, 1])]


def persistence(diagram: np.ndarray) -> np.ndarray:
    """Lifetimes ``death - birth`` of the finite bars, (k,) float64."""
    bars = finite_bars(diagram)
    return bars[:, 1] - bars[:, 0]


def total_persistence(diagram: np.ndarray) -> float:
    """Sum of finite lifetimes (0 for an empty diagram), in the cloud's distance units."""
    return float(persistence(diagram).sum())


def persistence_entropy(diagram: np.ndarray) -> float:
    """Shannon entropy (nats, *not* normalised) of lifetimes as a distribution over finite bars.

    ``-sum p_i log p_i`` with ``p_i = l_i / sum l``. Unnormalised so that it grows with the
    number of comparable bars (``log k`` for k equal bars); divide by ``log k`` to normalise.
    An empty diagram, or one whose lifetimes are all zero, has entropy 0.
    """
    life = persistence(diagram)
    life = life[life > 0]
    if life.size == 0:
        return 0.0
    p = life / life.sum()
    return float(-(p * np.log(p)).sum())


def significant_count(diagram: np.ndarray, fraction: float) -> int:
    """Number of finite bars whose lifetime exceeds ``fraction`` times the largest lifetime."""
    life = persistence(diagram)
    if life.size == 0:
        return 0
    return int(np.count_nonzero(life > fraction * life.max()))


def betti_curve(diagram: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Number of bars alive at each scale: ``birth <= s < death`` (essential bars included).

    Parameters
    ----------
    diagram : (k, 2) array
    scales : (S,) array of filtration values (distance units)

    Returns
    -------
    (S,) int64 array
    """
    bars = np.asarray(diagram, dtype=np.float64).reshape(-1, 2)
    s = np.asarray(scales, dtype=np.float64)[:, None]
    return np.count_nonzero((bars[None, :, 0] <= s) & (s < bars[None, :, 1]), axis=1).astype(np.int64)


def diagram_summary(diagrams: list[np.ndarray]) -> dict[str, float]:
    """Per-cloud summaries of ``[H0, H1]``: tp0, tp1, entropy0, entropy1, count1, maxpers1.

    All over finite bars (the essential H0 bar is excluded). ``maxpers1`` is 0 without H1 bars.
    """
    h0, h1 = diagrams
    life1 = persistence(h1)
    return {
        "tp0": total_persistence(h0),
        "tp1": total_persistence(h1),
        "entropy0": persistence_entropy(h0),
        "entropy1": persistence_entropy(h1),
        "count1": float(life1.size),
        "maxpers1": float(life1.max()) if life1.size else 0.0,
    }


# ---------------------------------------------------------------------------
# Diagram distances
# ---------------------------------------------------------------------------


def wasserstein_distance(dgm_a: np.ndarray, dgm_b: np.ndarray) -> float:
    """1-Wasserstein distance between the finite parts of two diagrams, equal to ``persim.wasserstein``.

    Euclidean ground metric; a bar may be matched to the diagonal at cost ``(d - b)/sqrt(2)``.
    Infinite bars are dropped explicitly first (persim would drop them with a warning); two
    empty diagrams are at distance 0.

    Notes
    -----
    persim solves an ``(M+N) x (M+N)`` assignment with diagonal copies. For p = 1 the same
    optimum is ``sum of all diagonal costs + min over partial matchings of sum (c_ij - d_i - d_j)``,
    and a pair only helps if that gain is negative, so an ``M x N`` assignment of
    ``min(0, c_ij - d_i - d_j)`` gives it exactly, about 8x faster.
    """
    a, b = finite_bars(dgm_a), finite_bars(dgm_b)
    diag_a = (a[:, 1] - a[:, 0]) / np.sqrt(2.0)
    diag_b = (b[:, 1] - b[:, 0]) / np.sqrt(2.0)
    base = float(diag_a.sum() + diag_b.sum())
    if a.shape[0] == 0 or b.shape[0] == 0:
        return base
    cross = np.hypot(a[:, None, 0] - b[None, :, 0], a[:, None, 1] - b[None, :, 1])
    gain = np.minimum(0.0, cross - diag_a[:, None] - diag_b[None, :])
    rows, cols = linear_sum_assignment(gain)
    return base + float(gain[rows, cols].sum())


def bottleneck_distance(dgm_a: np.ndarray, dgm_b: np.ndarray) -> float:
    """Bottleneck distance between the finite parts of two diagrams, equal to ``persim.bottleneck``.

    L-infinity ground metric; a bar matched to the diagonal costs half its lifetime. Infinite
    bars are dropped explicitly; two empty diagrams are at distance 0.

    Notes
    -----
    Binary search over the candidate values like persim, but each test is two small bipartite
    matchings instead of one on the ``(M+N)^2`` augmented graph: a matching of cost <= delta
    exists iff one can match all bars of ``a`` longer than ``2 delta`` into ``b`` and all bars of
    ``b`` longer than ``2 delta`` into ``a`` (Mendelsohn-Dulmage: two such one-sided matchings
    combine into one), the rest going to the diagonal.
    """
    a, b = finite_bars(dgm_a), finite_bars(dgm_b)
    if a.shape[0] == 0 and b.shape[0] == 0:
        return 0.0
    a, b = _nonempty(a), _nonempty(b)
    cross = np.maximum(np.abs(a[:, None, 0] - b[None, :, 0]), np.abs(a[:, None, 1] - b[None, :, 1]))
    half_a, half_b = (a[:, 1] - a[:, 0]) / 2, (b[:, 1] - b[:, 0]) / 2
    candidates = np.unique(np.concatenate([[0.0], cross.ravel(), half_a, half_b]))
    lo, hi = 0, candidates.size - 1  # the largest candidate always works
    while lo < hi:
        mid = (lo + hi) // 2
        if _matchable(cross, half_a, half_b, candidates[mid]):
            hi = mid
        else:
            lo = mid + 1
    return float(candidates[lo])


def _nonempty(bars: np.ndarray) -> np.ndarray:
    # persim's convention: an empty diagram becomes one point on the diagonal.
    return bars if bars.shape[0] else np.zeros((1, 2))


def _matchable(cross: np.ndarray, half_a: np.ndarray, half_b: np.ndarray, delta: float) -> bool:
    for heavy, graph in ((half_a > delta, cross), (half_b > delta, cross.T)):
        rows = np.flatnonzero(heavy)
        if rows.size == 0:
            continue
        adjacency = csr_matrix(graph[rows] <= delta)
        matched = maximum_bipartite_matching(adjacency, perm_type="column")
        if np.any(matched < 0):
            return False
    return True


# ---------------------------------------------------------------------------
# Representation topology (seed plan 000)
# ---------------------------------------------------------------------------


def pca_project(points: np.ndarray, dim: int) -> np.ndarray:
    """Centre and project onto the top ``min(dim, n, d)`` principal axes, (n, k) float64.

    Keeping all ``d`` axes is a rotation plus translation, which leaves every distance and
    hence every diagram unchanged.
    """
    x = np.asarray(points, dtype=np.float64)
    x = x - x.mean(axis=0)
    k = min(dim, x.shape[0], x.shape[1])
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    return x @ vt[:k].T


def betti_scales(points: np.ndarray, count: int) -> np.ndarray:
    """The Betti-curve grid: ``count`` scales evenly from 0 to the cloud's diameter.

    Relative to the diameter so that curves stay comparable across checkpoints whose hidden
    states have very different norms; the diameter itself is reported (``rep_diameter``) to
    recover absolute scales. A cloud of identical points has diameter 0 (all scales 0).
    """
    diameter = float(pdist(points).max()) if points.shape[0] > 1 else 0.0
    return np.linspace(0.0, diameter, count)


def representation_topology(
    states: np.ndarray, rep_points: int, rep_dim: int, seed: int, significance: float, scales: int
) -> tuple[dict[str, float], list[np.ndarray]]:
    """Topology of a hidden-state cloud: subsample, PCA, Vietoris-Rips H0/H1 and summaries.

    Parameters
    ----------
    states : (n, d) array
        Hidden states (one row per token position).
    rep_points : int
        Seeded subsample size (all rows if n is smaller).
    rep_dim : int
        PCA dimension; ``min(rep_dim, n, d)`` is used.
    seed : int
        Subsampling seed (same rows at every checkpoint for the same n).
    significance : float
        A bar is significant if its lifetime exceeds this fraction of the largest one.
    scales : int
        Number of Betti-curve scales (see :func:`betti_scales`).

    Returns
    -------
    features : dict
        ``rep_tp0, rep_tp1, rep_entropy0, rep_entropy1, rep_significant0, rep_significant1,
        rep_count1, rep_maxpers1, rep_diameter, rep_betti0_XX, rep_betti1_XX`` (XX = scale index).
        A single point or identical points give zeros, ``betti0 = 1`` and ``betti1 = 0``.
    diagrams : [H0, H1]
        As :func:`vietoris_rips_diagrams` (H0 includes the essential bar).
    """
    cloud = pca_project(subsample_rows(states, rep_points, seed), rep_dim)
    dgms = vietoris_rips_diagrams(cloud)
    summary = diagram_summary(dgms)
    grid = betti_scales(cloud, scales)
    features = {f"rep_{name}": value for name, value in summary.items()}
    features["rep_significant0"] = float(significant_count(dgms[0], significance))
    features["rep_significant1"] = float(significant_count(dgms[1], significance))
    features["rep_diameter"] = float(grid[-1])
    for dim in (0, 1):
        for i, value in enumerate(betti_curve(dgms[dim], grid)):
            features[f"rep_betti{dim}_{i:02d}"] = float(value)
    return features, dgms
