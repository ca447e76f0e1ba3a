"""A point cloud given as column chunks (per-example gradients, one example a row): its Gram matrix and
distances in one pass, and their summaries.

A cloud of ``B`` points in ``d`` dimensions that is too large to hold in float64 comes as ``(B, c)`` column
slices, in order (:data:`Chunks`, e.g. blocks of a layer's per-example gradients computed as they are read:
:func:`topometrics.landscape.gradients.linear_chunks`). :func:`cloud_geometry` sums the Gram matrix over float64
pieces of them (:func:`float64_pieces`, at most :data:`CHUNK_VALUES` values and 1/16 of the cloud) and takes the
distances from it, exact differences only for near-parallel pairs; :func:`distance_summary` gives the clouds'
Vietoris-Rips summaries, :func:`noise_scale` and :func:`mean_cosine` the non-topological baseline from the Gram
matrix. Pure functions over arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from topometrics.measures.persistence import diagram_summary, rips_diagrams

CHUNK_VALUES = 1 << 18  # float64 values of a (B, d) cloud converted at a time (2 MB)
BLOCK_VALUES = 1 << 22  # float32 values of a cloud one matrix product computes (16 MB; >= ~64 output rows a
# product keeps it near the speed of one big GEMM, where 20-row products ran at half of it)
LAYER_SHARE = 16  # and at most 1/16 of the cloud: a block in float32, a piece of it in float64 1/8 of the cloud
NEAR = 1e-4  # pairs with 1 - cos below this get their distances from their differences (cloud_geometry)
Chunks = Callable[[], Iterator[np.ndarray]]  # a cloud (B, d) as float (B, c) column slices, in order


def chunk_values(batch: int, numel: int) -> int:
    """Values of one float64 piece of a ``(batch, numel)`` cloud: :data:`CHUNK_VALUES`, or ``1 /``
    :data:`LAYER_SHARE` of the cloud when that is fewer, so a layer's pieces stay a fraction of its per-example
    gradients in float32 however small the layer."""
    return max(1, min(CHUNK_VALUES, batch * numel // LAYER_SHARE))


def block_values(batch: int, numel: int) -> int:
    """Values of one float32 block (one matrix product's output) of a ``(batch, numel)`` cloud: :data:`BLOCK_VALUES`,
    or ``1 /`` :data:`LAYER_SHARE` of the cloud when that is fewer."""
    return max(1, min(BLOCK_VALUES, batch * numel // LAYER_SHARE))


def column_chunks(points: np.ndarray) -> Iterator[np.ndarray]:
    """The columns of ``points`` (B, d) as ``(B, c)`` views of :func:`block_values` values (no copies)."""
    step = max(1, block_values(*points.shape) // max(1, points.shape[0]))
    for start in range(0, points.shape[1], step):
        yield points[:, start : start + step]


def float64_pieces(chunks: Iterator[np.ndarray], numel: int) -> Iterator[np.ndarray]:
    """Every chunk (B, c) as float64 ``(B, c')`` column pieces of at most :func:`chunk_values` values of a
    ``(B, numel)`` cloud, in order: no float64 copy of a whole chunk exists."""
    for part in chunks:
        step = max(1, chunk_values(part.shape[0], numel) // max(1, part.shape[0]))
        for start in range(0, part.shape[1], step):
            yield np.asarray(part[:, start : start + step], dtype=np.float64)


def noise_scale(gram: np.ndarray) -> float:
    """``tr(Sigma) / |g_mean|^2`` from the Gram matrix (B, B) of B per-example gradients (B >= 2): ``Sigma``'s
    trace is ``(sum |g_i|^2 - B |g_mean|^2) / (B - 1)``. 0 for identical gradients; NaN when the mean gradient is 0."""
    b = gram.shape[0]
    mean_sq = float(gram.sum()) / b**2
    trace = max(float(np.trace(gram)) - b * mean_sq, 0.0) / (b - 1)  # >= 0 up to rounding
    if mean_sq <= 0:
        return float("nan")
    return trace / mean_sq


def mean_cosine(gram: np.ndarray) -> float:
    """Mean cosine similarity over the ``B (B - 1) / 2`` pairs of gradients, from their Gram matrix (B, B);
    NaN when a gradient is zero (it has no direction)."""
    norms = np.sqrt(np.diag(gram))
    if not (norms > 0).all():
        return float("nan")
    cos = gram / np.outer(norms, norms)
    upper = np.triu_indices(gram.shape[0], k=1)
    return float(cos[upper].mean())


def cloud_geometry(
    chunks: Chunks, batch: int, numel: int, project: Callable[[np.ndarray], object] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The Gram matrix (B, B), the Euclidean distances (B, B) between the points of a ``(B, numel)`` cloud given
    as column chunks (``chunks()`` yields them), and the distances between its unit rows (zero rows dropped:
    (m, m)), from one pass over the chunks: the Gram matrix is a float64 sum over them, and the distances come
    from it, ``|a - b|^2 = |a|^2 + |b|^2 - 2 a.b`` and ``|a/|a| - b/|b||^2 = 2 (1 - cos)``.

    Both lose digits to cancellation only where ``cos`` is near 1: a pair with ``1 - cos <`` :data:`NEAR`
    (equal rows, nearly parallel ones) gets its two distances from the float64 sums of its squared differences
    instead, in a second pass over the chunks (made only when there is such a pair), so equal rows are exactly 0
    apart. For every other pair the relative error of a squared distance is at most about ``2 g / NEAR``, ``g``
    the Gram entries' own relative error (float64 sums: ~1e-15, so ~1e-11). ``project(piece)`` sees every float64
    piece (:func:`float64_pieces`) of the first pass, in order."""
    gram = np.zeros((batch, batch))
    for piece in float64_pieces(chunks(), numel):
        gram += piece @ piece.T
        if project is not None:
            project(piece)
    gram = (gram + gram.T) / 2  # symmetric to the last bit, so both halves of a pair's distance agree
    squares = np.diag(gram).copy()
    norms = np.sqrt(squares)
    keep = np.flatnonzero(norms > 0)
    raw = squares[:, None] + squares[None, :] - 2.0 * gram
    cos = gram[np.ix_(keep, keep)] / np.outer(norms[keep], norms[keep])
    unit = 2.0 - 2.0 * cos
    first, second = np.triu_indices(keep.size, 1)
    near = (1.0 - cos[first, second]) < NEAR
    if near.any():
        pairs = (keep[first[near]], keep[second[near]])
        exact_raw, exact_unit = _pair_differences(chunks, numel, *pairs, norms)
        raw[pairs], raw[pairs[::-1]] = exact_raw, exact_raw
        at = (first[near], second[near])
        unit[at], unit[at[::-1]] = exact_unit, exact_unit
    for dist in (raw, unit):
        np.fill_diagonal(dist, 0.0)
        np.maximum(dist, 0.0, out=dist)  # rounding of the Gram form can dip just below 0
    return gram, np.sqrt(raw), np.sqrt(unit)


def _pair_differences(
    chunks: Chunks, numel: int, a: np.ndarray, b: np.ndarray, norms: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``|x_a - x_b|^2`` and ``|x_a/|x_a| - x_b/|x_b||^2`` for the row pairs ``(a[i], b[i])`` of a cloud (norms
    > 0), as float64 sums of squared differences over its chunks: no cancellation."""
    raw, unit = np.zeros(a.size), np.zeros(a.size)
    for piece in float64_pieces(chunks(), numel):
        raw += ((piece[a] - piece[b]) ** 2).sum(axis=1)
        unit += ((piece[a] / norms[a, None] - piece[b] / norms[b, None]) ** 2).sum(axis=1)
    return raw, unit


def cloud_distances(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`cloud_geometry`'s distances of an array ``points`` (B, d), raw and between unit rows."""
    return cloud_geometry(lambda: column_chunks(points), *points.shape)[1:]


def distance_summary(raw: np.ndarray, unit: np.ndarray) -> dict[str, float]:
    """Vietoris-Rips summaries of a gradient cloud from its distances, raw and between unit rows: the keys of
    :func:`topometrics.measures.persistence.diagram_summary`, the unit ones prefixed ``unit_`` (NaN when fewer
    than 2 gradients are non-zero, the unit sphere then having no pairs)."""
    summary = diagram_summary(rips_diagrams(raw))
    unit_summary = diagram_summary(rips_diagrams(unit)) if unit.shape[0] >= 2 else dict.fromkeys(summary, np.nan)
    return summary | {f"unit_{key}": value for key, value in unit_summary.items()}


def cloud_summary(points: np.ndarray) -> dict[str, float]:
    """:func:`distance_summary` of a cloud ``points`` (B, d)."""
    return distance_summary(*cloud_distances(points))
