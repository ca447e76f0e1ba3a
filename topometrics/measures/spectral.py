"""Spectral baselines: effective rank (RankMe), participation ratio and matrix norms.

Pure functions over arrays. Conventions: ``0 log 0 = 0``; a matrix or cloud with no
variance (all singular values zero) has RankMe 0 and participation ratio 0 ("spans no
dimensions") instead of the undefined 0/0, so degenerate inputs give finite values.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import eigvalsh
from scipy.linalg.blas import dsyrk

from topometrics.measures.row_blocks import row_block_bounds


def singular_values(matrix: np.ndarray) -> np.ndarray:
    """Singular values of an ``(n, m)`` matrix, descending, float64: the square roots of the
    eigenvalues of its smaller Gram matrix (``W^T W`` or ``W W^T``, ``k = min(n, m)``).

    The Gram matrix is accumulated over blocks of rows (of columns when the matrix is wide),
    each converted to float64 on its own, so a worker holds the matrix and ``k^2`` float64
    numbers: an SVD of a float64 copy held two full-size copies (a streaming worker's peak memory,
    docs/scaling.md). Eigenvalues at most ``k * eps`` times the largest are the rounding of exact
    zeros and are returned as 0, as ``numpy.linalg.matrix_rank`` treats the singular values.
    Precision: a singular value ``s`` agrees with an SVD's to about ``eps * (s_max / s)^2``
    relative (1e-13 for the largest; trained layers keep ``s_max / s`` far below 1e4).
    """
    w = np.asarray(matrix)
    if w.ndim != 2:
        raise ValueError(f"a matrix must be 2-D, got shape {w.shape}")
    tall = w if w.shape[0] >= w.shape[1] else w.T  # rows of `tall` are summed over
    k = tall.shape[1]
    if k == 0 or tall.shape[0] == 0:
        return np.zeros(k)
    gram = np.zeros((k, k), order="F")  # upper triangle: BLAS syrk adds block^T block in place
    for start, stop in row_block_bounds(tall.shape[0], 8 * k):
        block = np.asarray(tall[start:stop], dtype=np.float64, order="F")
        gram = dsyrk(1.0, block, beta=1.0, c=gram, trans=1, overwrite_c=1)
    eigenvalues = eigvalsh(gram, lower=False, overwrite_a=True, check_finite=False)[::-1]
    eigenvalues[eigenvalues <= k * np.finfo(np.float64).eps * max(eigenvalues[0], 0.0)] = 0.0
    return np.sqrt(eigenvalues)


def rankme(singular_values: np.ndarray) -> float:
    """Effective rank ``exp(H(p))`` with ``p_k = s_k / sum s`` (Garrido et al. 2023, RankMe).

    Parameters
    ----------
    singular_values : (k,) array of non-negative values

    Returns
    -------
    float in ``[1, k]``, or 0 if every value is 0. No epsilon is added (the paper adds 1e-7 to
    each ``p_k``), so an exactly rank-r spectrum with equal values gives exactly r.
    """
    s = np.asarray(singular_values, dtype=np.float64)
    if np.any(s < 0):
        raise ValueError("singular values must be non-negative")
    total = s.sum()
    if total == 0:
        return 0.0
    p = s[s > 0] / total
    return float(np.exp(-(p * np.log(p)).sum()))


def participation_ratio(eigenvalues: np.ndarray) -> float:
    """``(sum l)^2 / sum l^2`` of covariance eigenvalues (0 if every eigenvalue is 0)."""
    lam = np.asarray(eigenvalues, dtype=np.float64)
    denom = np.sum(lam**2)
    return float(lam.sum() ** 2 / denom) if denom > 0 else 0.0


def weight_spectrum(weight: np.ndarray, singular: np.ndarray | None = None) -> dict[str, float]:
    """Spectral baselines of one weight matrix (uncentred: a linear map, not a cloud).

    Parameters
    ----------
    weight : (out, in) array
    singular : its singular values, when the caller already has them (computed here otherwise)

    Returns
    -------
    dict
        ``rankme`` (RankMe of the singular values), ``pr`` (participation ratio of the
        eigenvalues ``s^2`` of ``W W^T``), ``fro`` (Frobenius norm), ``spec`` (largest
        singular value).
    """
    s = singular_values(weight) if singular is None else singular
    return {
        "rankme": rankme(s),
        "pr": participation_ratio(s**2),
        "fro": float(np.sqrt(np.sum(s**2))),
        "spec": float(s.max()) if s.size else 0.0,
    }


def covariance_spectrum(states: np.ndarray) -> dict[str, float]:
    """RankMe and participation ratio of a cloud's covariance.

    Parameters
    ----------
    states : (n, d) array, one point per row

    Returns
    -------
    dict
        ``rankme``: RankMe of the singular values of the centred cloud (the square roots of
        the covariance eigenvalues, up to a constant); ``pr``: participation ratio of the
        covariance eigenvalues. Both are invariant to scale, rotation and translation.
    """
    x = np.asarray(states, dtype=np.float64)
    x = x - x.mean(axis=0)
    s = np.linalg.svd(x, compute_uv=False)
    return {"rankme": rankme(s), "pr": participation_ratio(s**2)}
