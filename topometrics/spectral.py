"""Spectral baselines: effective rank (RankMe), participation ratio and matrix norms.

Pure functions over arrays. Conventions: ``0 log 0 = 0``; a matrix or cloud with no
variance (all singular values zero) has RankMe 0 and participation ratio 0 ("spans no
dimensions") instead of the undefined 0/0, so degenerate inputs give finite values.
"""

from __future__ import annotations

import numpy as np


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


def weight_spectrum(weight: np.ndarray, singular_values: np.ndarray | None = None) -> dict[str, float]:
    """Spectral baselines of one weight matrix (uncentred: a linear map, not a cloud).

    Parameters
    ----------
    weight : (out, in) array
    singular_values : its singular values, when the caller already has them (computed here otherwise)

    Returns
    -------
    dict
        ``rankme`` (RankMe of the singular values), ``pr`` (participation ratio of the
        eigenvalues ``s^2`` of ``W W^T``), ``fro`` (Frobenius norm), ``spec`` (largest
        singular value).
    """
    s = singular_values
    if s is None:
        s = np.linalg.svd(np.asarray(weight, dtype=np.float64), compute_uv=False)
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
