"""Vietoris-Rips persistence of point clouds, diagram summaries and diagram distances: pure functions.

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

Neural persistence uses a different filtration (``topometrics.measures.neural_persistence``); the
hidden-state cloud's topology is ``topometrics.measures.representation``.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching
from scipy.spatial.distance import cdist, squareform

from topometrics.measures.spanning_tree import dense_max_tree

try:
    # ripser's compiled core, which ripser.ripser() wraps. The wrapper module imports
    # scikit-learn (for pairwise_distances, unused here): ~1 s per process, paid again by
    # every worker; tests check that both give the same diagrams.
    from pyRipser import doRipsFiltrationDM as _rips_filtration
except ImportError:  # a ripser build without the top-level core module
    _rips_filtration = None

# ---------------------------------------------------------------------------
# Vietoris-Rips diagrams and their summaries
# ---------------------------------------------------------------------------


DISTANCE_BLOCK = 32  # float64 rows converted at a time by row_distances (two blocks live: 1 MB at 2048 columns)


def subsample_indices(n: int, max_points: int, seed: int) -> np.ndarray:
    """The rows :func:`subsample_rows` takes of an ``n``-row cloud, ascending: all of them when
    ``n <= max_points``, else ``max_points`` drawn without replacement with ``default_rng(seed)``."""
    if max_points <= 0:
        raise ValueError(f"max_points must be positive, got {max_points}")
    if n <= max_points:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, max_points, replace=False))


def subsample_rows(points: np.ndarray, max_points: int, seed: int) -> np.ndarray:
    """At most ``max_points`` rows (:func:`subsample_indices`), drawn without replacement with
    ``default_rng(seed)``.

    Clouds that already fit are returned whole and in order (no randomness involved); the
    chosen rows keep their original order. The same seed picks the same row indices at every
    checkpoint, so consecutive diagrams describe the same neurons.
    """
    points = np.asarray(points)
    idx = subsample_indices(points.shape[0], max_points, seed)
    return points if idx.size == points.shape[0] else points[idx]


def row_distances(points: np.ndarray, rows: np.ndarray | None = None, scale: float = 1.0) -> np.ndarray:
    """Euclidean distances between the rows ``points[rows]`` (all rows by default), each row taken
    in float64 and divided by ``scale``: a symmetric ``(k, k)`` float64 array with a zero diagonal.

    The same values, bit for bit, as ``squareform(pdist(points[rows].astype(float64) / scale))``
    (scipy's ``cdist`` on blocks, the kernel ``pdist`` uses), but only two blocks of
    :data:`DISTANCE_BLOCK` float64 rows exist at a time, never the float64 subsample: for a wide
    layer that subsample is as large as the layer's own float32 buffer.
    """
    points = np.asarray(points)
    if points.ndim != 2:
        raise ValueError(f"points must be an (n, d) array, got shape {points.shape}")
    rows = np.arange(points.shape[0]) if rows is None else np.asarray(rows)
    k = rows.size
    dist = np.zeros((k, k))

    def block(start: int) -> np.ndarray:
        out = np.asarray(points[rows[start : start + DISTANCE_BLOCK]], dtype=np.float64)
        return out / scale if scale != 1.0 else out

    for i in range(0, k, DISTANCE_BLOCK):
        left = block(i)
        for j in range(i, k, DISTANCE_BLOCK):
            right = left if j == i else block(j)
            d = cdist(left, right)
            dist[i : i + left.shape[0], j : j + right.shape[0]] = d
            dist[j : j + right.shape[0], i : i + left.shape[0]] = d.T
    np.fill_diagonal(dist, 0.0)
    return dist


def vietoris_rips_diagrams(points: np.ndarray) -> list[np.ndarray]:
    """Vietoris-Rips H0 and H1 diagrams of a point cloud, with no filtration threshold.

    Parameters
    ----------
    points : (n, d) array
        Euclidean point cloud (n >= 1).

    Returns
    -------
    [H0, H1] : list of (k, 2) float64 arrays
        As :func:`rips_diagrams` of the cloud's :func:`row_distances`.
    """
    points = np.asarray(points)
    if points.ndim != 2 or points.shape[0] == 0:
        raise ValueError(f"points must be a non-empty (n, d) array, got shape {points.shape}")
    return rips_diagrams(row_distances(points))


def rips_diagrams(dist: np.ndarray) -> list[np.ndarray]:
    """Vietoris-Rips H0 and H1 diagrams from a cloud's ``(n, n)`` Euclidean distance matrix (n >= 1).

    H0 is exact in float64: bars ``(0, e)`` for the edges ``e > 0`` of the Euclidean minimum
    spanning tree of the *distinct* points, in ascending order, plus the essential bar
    ``(0, inf)``. Duplicate points are removed first: they only add zero-length bars, which ripser
    does not report either. H1 comes from ripser (maxdim=1, no threshold) on the same distances, in
    ripser's order (births descending); ripser computes in float32, so H1 values carry float32
    rounding. Fewer than 4 distinct points have no H1.
    """
    if not np.isfinite(dist).all():  # a non-finite coordinate makes its row's distances NaN or Inf
        raise ValueError("points contain NaN/Inf; Vietoris-Rips is undefined")
    n = dist.shape[0]
    if np.count_nonzero(dist) < n * (n - 1):  # rare, so the common case skips the duplicate search
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
    :func:`topometrics.measures.spanning_tree.dense_max_tree` on ``-dist``; on clouds of ~200 points it
    skips scipy's dense-to-CSR conversion and edge sort, ~20x faster.
    """
    weights = -dist
    np.fill_diagonal(weights, -np.inf)
    return -dense_max_tree(weights)


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
    combine into one), the rest going to the diagonal. Only the candidates between two bounds are searched: every
    bar goes somewhere, to a bar of the other diagram or to the diagonal, so the distance is at least the largest
    over bars of the cheaper of the two; every bar may go to the diagonal, so it is at most the largest half
    lifetime (both bounds are candidates; on consecutive checkpoints' diagrams they leave a few percent of them).
    """
    a, b = finite_bars(dgm_a), finite_bars(dgm_b)
    if a.shape[0] == 0 and b.shape[0] == 0:
        return 0.0
    a, b = _nonempty(a), _nonempty(b)
    cross = np.maximum(np.abs(a[:, None, 0] - b[None, :, 0]), np.abs(a[:, None, 1] - b[None, :, 1]))
    half_a, half_b = (a[:, 1] - a[:, 0]) / 2, (b[:, 1] - b[:, 0]) / 2
    lower = max(np.minimum(half_a, cross.min(axis=1)).max(), np.minimum(half_b, cross.min(axis=0)).max())
    upper = max(half_a.max(), half_b.max())
    values = np.concatenate([[0.0], cross.ravel(), half_a, half_b])
    candidates = np.unique(values[(values >= lower) & (values <= upper)])
    lo, hi = 0, candidates.size - 1  # the largest candidate (the upper bound) always works
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
        near = graph[rows] <= delta
        # the CSR arrays from the mask itself: scipy's dense-to-sparse conversion was most of a test's time
        indptr = np.concatenate([[0], np.cumsum(near.sum(axis=1))])
        adjacency = csr_matrix((np.ones(indptr[-1], bool), near.nonzero()[1], indptr), shape=near.shape)
        matched = maximum_bipartite_matching(adjacency, perm_type="column")
        if np.any(matched < 0):
            return False
    return True
