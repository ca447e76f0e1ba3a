"""Neural persistence of a layer (Rieck et al. 2019): the maximum spanning tree of its bipartite graph.

A linear layer ``W`` (out x in) is a complete bipartite graph, one vertex per output and input
neuron and one edge per weight, valued ``a = |w| / max|w|``. Its descending filtration's H0 deaths
are the maximum-spanning-tree edge values; :func:`neural_persistence` summarises them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.sparse import coo_matrix, csr_matrix
from scipy.sparse.csgraph import connected_components, minimum_spanning_tree

from topometrics.measures.row_blocks import row_block_bounds
from topometrics.measures.spanning_tree import (
    block_max,
    boruvka_components,
    dense_max_tree,
    random_arrangement_tree,
)

# Below this many edges, sorting everything is cheaper than the banded algorithm's overhead.
_SMALL_LAYER_EDGES = 1 << 15
# Edges kept in the Kruskal band per vertex; ~4 spans a Gaussian 2048x8192 layer in one go.
_BAND_PER_VERTEX = 4
# Up to this many vertices without a band edge, their argmax is taken one by one.
_FEW_LOW_VERTICES = 64
# Up to this many column groups, the contraction masks columns instead of gathering them.
_FEW_GROUPS = 16


_NON_FINITE = "layer has NaN/Inf weights; neural persistence is undefined (treat the checkpoint as diverged)"


class NeuralPersistence(NamedTuple):
    np_norm: float  # reference normalisation: sqrt(sum (1-a_e)^2 + 1) / sqrt(|V| - 1)
    np_sum: float  # the paper's eq. 1: sum (1-a_e) / (|V| - 1)


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
       blocked pass finds the largest edge between every pair of components and the dense
       maximum spanning tree of that ``k x k`` graph finishes it exactly (tree = forest + a
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
    """Neural persistence of one linear layer (Rieck et al. 2019; ``np_sum`` is the paper's eq. 1).

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
    return tree_persistence(bipartite_max_spanning_tree(weight), global_max)


def tree_persistence(tree: np.ndarray, global_max: float) -> NeuralPersistence:
    """:func:`neural_persistence` from the layer's tree (:func:`bipartite_max_spanning_tree`), so
    callers that need the tree for other measures compute it once."""
    if not np.isfinite(global_max) or global_max < 0:
        raise ValueError(f"global_max must be a finite non-negative number, got {global_max!r}")
    scale = 1.0 / global_max if global_max > 0 else 0.0
    pers = 1.0 - np.clip(tree * scale, 0.0, 1.0)
    edges = tree.size  # |V| - 1
    np_norm = float(np.sqrt((np.sum(pers**2) + 1.0) / edges))
    return NeuralPersistence(np_norm=np_norm, np_sum=float(pers.sum() / edges))


def shuffled_neural_persistence(
    weight: np.ndarray, global_max: float, seed: int | list[int], *, in_place: bool = False
) -> NeuralPersistence:
    """Neural persistence after a seeded uniformly random permutation of the layer's entries (a null model).

    Same multiset of weights, so the same spread and the same ``global_max``; only the arrangement changes.
    ``seed`` goes to ``np.random.default_rng`` (an int or a list of ints, e.g. ``[seed, layer_index]``), so the
    result is deterministic. The permutation is never carried out: the tree of a random arrangement is drawn
    from the sorted ``|w|`` (:func:`~topometrics.measures.spanning_tree.random_arrangement_tree`).
    ``in_place``: sort ``weight``'s own (C-contiguous) buffer instead of a copy, for a caller done with the
    layer's arrangement.
    """
    a = _validated_layer(weight)
    if in_place and not (a is weight and a.flags.c_contiguous and a.flags.writeable):
        raise ValueError("in_place needs a writeable C-contiguous float32/float64 layer")
    descending = sorted_magnitudes(a if in_place else a.copy())
    tree = random_arrangement_tree(descending, *a.shape, np.random.default_rng(seed))
    return tree_persistence(tree, global_max)


def sorted_magnitudes(entries: np.ndarray) -> np.ndarray:
    """``|entries|`` sorted descending (flat), computed in ``entries``' own C-contiguous buffer (overwritten);
    the layer must be finite (NaN and Inf sort last, so one look at the largest checks)."""
    flat = entries.reshape(-1)
    if not np.shares_memory(flat, entries):
        raise ValueError("entries must be a C-contiguous array (they are sorted in place)")
    np.abs(flat, out=flat)
    flat.sort()
    if flat.size and not np.isfinite(flat[-1]):
        raise ValueError(_NON_FINITE)
    return flat[::-1]


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
    :func:`topometrics.measures.spanning_tree.dense_max_tree` on the complete graph of the resulting components.
    """
    w = np.abs(a)
    n, m = w.shape
    # Vertices 0..n-1 are rows, n..n+m-1 columns.
    best = np.concatenate([n + w.argmax(axis=1), w.argmax(axis=0)])
    value = np.concatenate([w.max(axis=1), w.max(axis=0)])
    labels, is_root = boruvka_components(best)
    # Every component holds a row and a column (each vertex joined one of the other side), so
    # every block is non-empty; the edge between two components is the larger way round.
    between = block_max(w, labels[:n], labels[n:], int(is_root.sum()))
    between = np.maximum(between, between.T)
    np.fill_diagonal(between, -np.inf)
    return np.concatenate([value[~is_root], dense_max_tree(between)]).astype(np.float64)


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
    bounds = row_block_bounds(a.shape[0], a.itemsize * a.shape[1])  # abs and the band test share the cached block
    buf = np.empty((bounds[0][1] if bounds else 0, a.shape[1]), dtype=a.dtype)
    for start, stop in bounds:
        block = buf[: stop - start]
        np.abs(a[start:stop], out=block)
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
    np.fill_diagonal(between, -np.inf)
    if np.any(between == -1.0):
        # every forest edge joins a row and a column, so every component holds both
        raise RuntimeError("contracted graph is disconnected; a component has no rows or no columns")
    return dense_max_tree(between)
