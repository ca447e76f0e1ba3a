"""Heavy-tail exponent alpha of a spectrum: Clauset-Shalizi-Newman fits of eigenvalue tails.

The scale-invariant spectral baseline of Martin & Mahoney (WeightWatcher's ``alpha``): the
empirical spectral density of ``W^T W`` (eigenvalues = squared singular values of ``W``) has a
power-law tail ``p(x) ~ x^(-alpha)`` for ``x >= xmin``; smaller alpha = heavier tail. The same fit
on the eigenvalues of the hidden states' covariance gives the representation's exponent.

The fit (Clauset, Shalizi & Newman 2009, continuous case): for every candidate ``xmin`` among the
eigenvalues, alpha is the closed-form maximum-likelihood estimate ``1 + n / sum ln(x_i / xmin)``
over the ``n`` values ``>= xmin``, and the ``xmin`` whose fitted CDF is closest to the empirical
one in Kolmogorov-Smirnov distance wins. Implemented here in numpy, all candidates at once: the
``powerlaw`` package (2.0.0, in the lock) implements the same method but refits each candidate
through its generic distribution objects (~25 ms per 48-value spectrum, and it imports
matplotlib), which per layer and checkpoint would cost more than the topology; the tests check
this implementation against ``powerlaw.Fit`` and against samples of a known power law.

A fit needs data: a spectrum with fewer than :data:`MIN_EIGENVALUES` positive eigenvalues gives
NULL with a reason, and ``xmin`` is searched only where at least :data:`MIN_TAIL` values remain in
the tail, so no alpha comes from a handful of points.

Pure functions over arrays. alpha is invariant to scaling the matrix (eigenvalues scale by
``c^2``; ``x_i / xmin`` and the KS distance do not change) and to permuting its rows or columns.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# At least this many positive eigenvalues to fit at all (WeightWatcher's default minimum is 10; the
# 8- and 16-wide layers of the ladder's smallest rungs fall below this and get NULL).
MIN_EIGENVALUES = 24
# ... and at least this many in the fitted tail (a power-law fit on fewer points is noise:
# the standard error of alpha is (alpha - 1) / sqrt(n_tail)).
MIN_TAIL = 12
# Relative size below which an eigenvalue counts as zero (rank deficiency, not part of the density).
ZERO_TOLERANCE = 1e-12


class AlphaFit(NamedTuple):
    """A power-law tail fit: alpha (NaN exactly when ``reason`` says why), xmin, tail size, KS distance."""

    alpha: float
    xmin: float
    n_tail: int
    ks: float
    reason: str | None = None


def fit_tail(values, min_values: int = MIN_EIGENVALUES, min_tail: int = MIN_TAIL) -> AlphaFit:
    """Clauset-Shalizi-Newman fit of the power-law tail of positive ``values``.

    Parameters
    ----------
    values : array_like, (n,)
        Eigenvalues (any order). Values ``<= ZERO_TOLERANCE * max`` are dropped as zeros.
    min_values, min_tail : int
        Minimum number of positive values, and of values in the tail.

    Returns
    -------
    AlphaFit
        alpha = ``1 + n_tail / sum ln(x / xmin)`` at the xmin with the smallest KS distance
        ``max |S(x) - P(x)|`` (S the empirical CDF of the tail, both sides of each step;
        P(x) = 1 - (x / xmin)^(1 - alpha)); ties go to the smaller xmin. NaN with a reason
        when there are too few values, all tail values are equal, or the values are not finite.
    """
    x = np.asarray(values, dtype=np.float64).ravel()
    if not np.isfinite(x).all():
        return AlphaFit(np.nan, np.nan, 0, np.nan, "non-finite eigenvalues")
    x = np.sort(x[x > ZERO_TOLERANCE * max(float(x.max(initial=0.0)), 0.0)])
    n = x.size
    if n < min_values:
        return AlphaFit(np.nan, np.nan, n, np.nan, f"{n} positive eigenvalues, fewer than {min_values} to fit a tail")
    # Candidate xmin = each distinct value that leaves at least min_tail values in the tail.
    starts = np.flatnonzero(np.r_[True, x[1:] != x[:-1]])
    starts = starts[n - starts >= min_tail]
    logs = np.log(x)
    alphas, ks = [], []
    for s in starts:  # <= n candidates of O(n) each; n is a layer width
        tail = logs[s:] - logs[s]
        total = tail.sum()
        if total <= 0:
            alphas.append(np.nan)
            ks.append(np.inf)
            continue
        k = tail.size
        alpha = 1.0 + k / total
        cdf = 1.0 - np.exp((1.0 - alpha) * tail)
        steps = np.arange(k + 1) / k
        ks.append(max(np.max(steps[1:] - cdf), np.max(cdf - steps[:-1])))
        alphas.append(alpha)
    ks = np.asarray(ks)
    if not starts.size or not np.isfinite(ks).any():
        return AlphaFit(np.nan, np.nan, n, np.nan, f"no tail of at least {min_tail} distinct-valued eigenvalues")
    best = int(np.argmin(ks))
    s = int(starts[best])
    return AlphaFit(float(alphas[best]), float(x[s]), int(n - s), float(ks[best]))


def covariance_alpha(states: np.ndarray) -> AlphaFit:
    """alpha of the covariance spectrum of a cloud (rows = points), centred."""
    x = np.asarray(states, dtype=np.float64)
    s = np.linalg.svd(x - x.mean(axis=0), compute_uv=False)
    return fit_tail(s**2)
