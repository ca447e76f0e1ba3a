"""Topology of a hidden-state cloud: seeded subsample, PCA, Vietoris-Rips H0/H1, summaries, Betti curves."""

from __future__ import annotations

import numpy as np
from scipy.spatial.distance import pdist

from topometrics.measures.persistence import (
    betti_curve,
    diagram_summary,
    significant_count,
    subsample_rows,
    vietoris_rips_diagrams,
)


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
        ``tp0, tp1, entropy0, entropy1, count1, maxpers1, significant0, significant1, diameter,
        betti0_XX, betti1_XX`` (XX = scale index).
        A single point or identical points give zeros, ``betti0 = 1`` and ``betti1 = 0``.
    diagrams : [H0, H1]
        As :func:`vietoris_rips_diagrams` (H0 includes the essential bar).
    """
    cloud = pca_project(subsample_rows(states, rep_points, seed), rep_dim)
    dgms = vietoris_rips_diagrams(cloud)
    summary = diagram_summary(dgms)
    grid = betti_scales(cloud, scales)
    features = dict(summary)
    features["significant0"] = float(significant_count(dgms[0], significance))
    features["significant1"] = float(significant_count(dgms[1], significance))
    features["diameter"] = float(grid[-1])
    for dim in (0, 1):
        for i, value in enumerate(betti_curve(dgms[dim], grid)):
            features[f"betti{dim}_{i:02d}"] = float(value)
    return features, dgms
