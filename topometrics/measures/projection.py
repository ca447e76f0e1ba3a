"""The one Johnson-Lindenstrauss projection of the package: a seeded sparse sign matrix, never materialised.

``P`` is a ``(D, k)`` matrix (``D`` coordinates of a long vector, e.g. a network's weights or one example's
gradient, flattened; ``k`` sketch dimensions) and ``x (D,) -> x @ P (k,)`` the sketch, in the units of ``x``.
It is the *block construction* of Kane and Nelson (2014, "Sparser Johnson-Lindenstrauss transforms", J. ACM
61(1):4, section 2, construction (b); the OSNAP/CountSketch family of Nelson and Nguyen 2013): the ``k``
columns are split into :data:`NONZEROS` = ``s`` blocks of ``m = k / s`` columns, and every coordinate ``i`` has
exactly one nonzero in each block, ``+-1 / sqrt(s)`` in column ``b m + h_b(i)``: ``s`` nonzeros per row of
``P``, so ``x @ P`` costs ``O(D s)`` instead of the dense Gaussian's ``O(D k)`` draws and products.

**Where the randomness comes from.** Bucket ``h_b(i)`` and sign of coordinate ``i`` are 16-bit fields of the
words ``w i .. w i + w - 1`` (``w = ceil(s / 4)``, 4 fields a word) of numpy's Philox-4x64 counter-based
generator keyed by ``seed`` (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3";
``np.random.Philox(key=seed).random_raw``, whose bit stream numpy keeps stable across versions): bit 15 is the
sign, the low 15 bits ``f`` give the bucket ``(f m) >> 15`` (uniform when ``m`` is a power of two, as at the
default ``k`` = 64: ``m`` = 8). So row ``i`` of ``P`` depends on ``(seed, i)`` only: any slice of the vector,
in any order (``offset`` = its first coordinate), is projected on its own, and the sketches of the slices sum
to the sketch of the whole (tested); nothing is drawn per call beyond the slice's own ``w`` words a coordinate.

**Distortion.** ``E |x P|^2 = |x|^2`` for every ``x`` (each coordinate lands in ``s`` columns with weight
``1/s`` each, signs independent), and ``Var |x P|^2 = (2/k) (|x|_2^4 - |x|_4^4) <= (2/k) |x|^4``: at most the
Gaussian matrix's ``2/k`` (``chi^2_k / k``). Kane and Nelson prove the JL property (``|x P|^2`` within
``1 +- eps`` of ``|x|^2`` with probability ``1 - delta``) for ``k = O(eps^-2 log 1/delta)`` and
``s = O(eps^-1 log 1/delta)``, the Gaussian's ``k`` up to the constant, for hash functions of
``O(log 1/delta)``-wise independence (Philox's bits stand in for fully random ones; ``s`` = 8 at k = 64 is a
choice, checked by simulation, not the theorem's constant). For a vector spread over many coordinates
(weights, their differences, gradients) the ratio ``|x P| / |x|`` is distributed approximately (a central
limit) as the Gaussian's ``sqrt(chi^2_k / k)`` (for k = 64: 95 % of ratios within about 0.83-1.17); a vector with one
nonzero keeps its norm exactly; one with two equal nonzeros keeps it exactly unless the two share a bucket in
some block (probability ``1 - (1 - 1/m)^s``, 0.66 at k = 64), each sharing moving ``|x P|^2`` by
``+-|x|^2 / s``. (Li, Hastie and Church's "very sparse" projections, 2006, with a fraction ``1/sqrt(D)`` of
the entries nonzero, send most single coordinates to 0: the reason for a fixed ``s`` per coordinate.) Tests:
``tests/measures/test_projection.py``.

**Cost.** Per coordinate ``w`` raw words and ``s`` additions per row of ``x`` (a 0/1 CSR product); at most
:data:`CHUNK` coordinates' indices exist at a time (``chunk`` fewer), :func:`workspace_bytes` each.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse

PROJECTION = "sparse-sign-philox-v1"  # names this matrix where a file records projections (training.sketch)
NONZEROS = 8  # s: nonzeros per coordinate (row of P), one in each of s column blocks
CHUNK = 1 << 16  # coordinates whose nonzeros exist at a time
FIELD_BITS = 15  # a bucket comes from a 15-bit field, a sign from the 16th


def nonzeros(k: int) -> int:
    """``s`` for ``k`` dimensions: the largest divisor of ``k`` up to :data:`NONZEROS` (8 at k = 64; k = 10 gives 5)."""
    if k <= 0:
        raise ValueError(f"the projection needs k > 0 dimensions, got {k}")
    return max(d for d in range(1, min(NONZEROS, k) + 1) if k % d == 0)


def workspace_bytes(k: int) -> int:
    """Bytes of index workspace per coordinate :func:`project` holds (raw words, 16-bit fields, int32 columns,
    the CSR product's ones and row pointers), a bound: ``8 w + 24 s + 16`` (224 at k = 64)."""
    s = nonzeros(k)
    return 8 * -(-s // 4) + 24 * s + 16


def projection_rows(n: int, offset: int, k: int, seed: int) -> np.ndarray:
    """Rows ``offset .. offset + n - 1`` of ``P`` (``(D, k)``, ``seed``) as the columns of their nonzeros in the
    *split* layout, ``(n, s)`` int32: block ``b``'s nonzero of row ``r`` at ``2 m b + m sign + h_b(r)``
    (``sign`` 1 for ``-1/sqrt(s)``), so that ``x @ P`` is ``(y[:, :, 0] - y[:, :, 1]) / sqrt(s)`` of the
    0/1 product ``y = x @ S`` (``S`` ``(D, 2k)``, viewed ``(B, s, 2, m)``): no per-coordinate values exist."""
    s = nonzeros(k)
    m, words = k // s, -(-s // 4)
    first = offset * words
    gen = np.random.Philox(key=seed % (1 << 128), counter=first // 4)
    raw = gen.random_raw(n * words + first % 4)[first % 4 :]
    fields = raw.astype("<u8", copy=False).view("<u2").reshape(n, words * 4)[:, :s]
    if m & (m - 1) == 0:  # m = 2^p: (f m) >> 15 is f's top p bits, and f >> (15 - p) = sign m + bucket
        split = fields >> (FIELD_BITS - (m.bit_length() - 1))
    else:
        f = fields.astype(np.uint32)
        split = (((f & ((1 << FIELD_BITS) - 1)) * m) >> FIELD_BITS) + (f >> FIELD_BITS) * m
    return (split + np.arange(0, 2 * k, 2 * m, dtype=split.dtype)).astype(np.int32)


def project(
    block: np.ndarray, k: int, seed: int, offset: int = 0, out: np.ndarray | None = None, chunk: int = CHUNK
) -> np.ndarray:
    """``out + block @ P[offset : offset + block.shape[1]]``: ``block`` ``(B, c)`` (or ``(c,)``) holds
    coordinates ``offset .. offset + c - 1`` of ``B`` vectors; returns ``(B, k)`` (``(k,)``) float64, added
    into ``out`` in place when given (None: zeros). ``chunk`` coordinates at a time (any ``chunk`` gives the
    same numbers up to the order of the float64 sums)."""
    block = np.asarray(block)
    single = block.ndim == 1
    rows = block.reshape(1, -1) if single else block
    if out is None:
        out = np.zeros(k) if single else np.zeros((rows.shape[0], k))
    target = out.reshape(1, -1) if single else out
    s = nonzeros(k)
    split = np.zeros((rows.shape[0], 2 * k))
    ones, pointers = _ones_and_pointers(min(rows.shape[1], max(1, chunk)), s)
    for start in range(0, rows.shape[1], max(1, chunk)):
        part = rows[:, start : start + chunk]
        n = part.shape[1]
        columns = projection_rows(n, offset + start, k, seed).ravel()
        matrix = scipy.sparse.csr_matrix((ones[: n * s], columns, pointers[: n + 1]), (n, 2 * k))
        split += np.asarray(matrix.T @ np.asarray(part, dtype=np.float64).T).T
    halves = split.reshape(-1, s, 2, k // s)
    target += (halves[:, :, 0] - halves[:, :, 1]).reshape(-1, k) / math.sqrt(s)
    return out


_SHARED: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # s -> read-only ones and row pointers, grown as needed


def _ones_and_pointers(n: int, s: int) -> tuple[np.ndarray, np.ndarray]:
    """The CSR product's data (``n s`` ones) and row pointers (``0, s, .., n s``, int32) for ``n`` coordinates:
    made once and shared (read-only), so a call allocates neither (a small sketch is mostly allocation)."""
    have = _SHARED.get(s)
    if have is None or have[1].size < n + 1:
        ones, pointers = np.ones(n * s), np.arange(0, n * s + 1, s, dtype=np.int32)
        ones.flags.writeable = pointers.flags.writeable = False
        _SHARED[s] = have = (ones, pointers)
    return have
