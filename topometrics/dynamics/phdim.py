"""The persistent-homology dimension of a point cloud (the PH0 dimension): a fractal dimension from H0 persistence.

Adams et al. (2020), Birdal et al. (2021): for ``n`` points drawn from a set of dimension ``d``, the total
H0 persistence with exponent ``alpha``, ``E_alpha(n) = sum over the finite H0 bars of (death - birth)^alpha``,
grows like ``n^((d - alpha) / d)`` when ``alpha < d``. Fitting ``log E_alpha`` against ``log n`` over
subsamples of growing size gives a slope ``m`` and the dimension ``alpha / (1 - m)``. The reference is the
authors' code (``tolgabirdal/PHDimGeneralization``, ``calculate_ph_dim``): one random subsample per size, a
least-squares line through ``(log n, log E_alpha)``; here the H0 bars are the Euclidean minimum spanning
tree's edges (exactly Vietoris-Rips H0, :mod:`topometrics.measures.persistence`), and each size may average
several seeded draws.

The exponent must lie below the true dimension: where ``d <= alpha``, ``E_alpha`` stays bounded, the slope
goes to 0 and the estimate reads ``alpha`` whatever ``d`` is (a Cantor set, ``d = 0.63``, reads 1.00 with
``alpha = 1`` and about 0.67 with ``alpha = 0.25``). A reading near ``alpha`` therefore means "at most alpha".
A smaller ``alpha`` reaches lower dimensions but amplifies the slope's noise by ``d^2 / alpha``.

Too few points for the fit give NaN with a reason (:class:`PHDimension`), never a number.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from topometrics.measures.persistence import euclidean_mst_lengths, row_distances

MIN_SIZE = 8  # smallest subsample the fit uses: a spanning tree of fewer points says little about its growth
MIN_SIZES = 3  # distinct subsample sizes a line is fitted through (two always fit exactly)


class PHDimension(NamedTuple):
    """A PH0 dimension estimate: ``dimension`` (NaN exactly when ``reason`` says why), the fitted slope of
    ``log E_alpha`` on ``log n``, the subsample sizes used and the points available."""

    dimension: float
    slope: float
    sizes: tuple[int, ...]
    n_points: int
    reason: str | None = None


def h0_alpha_weight(points: np.ndarray, alpha: float) -> float:
    """``E_alpha``: the sum of the finite Vietoris-Rips H0 lifetimes of ``points`` (n, d), each to the power
    ``alpha`` (the minimum spanning tree's edge lengths; duplicate points add zero-length edges, so nothing)."""
    points = np.asarray(points, dtype=np.float64)
    if points.shape[0] < 2:
        return 0.0
    edges = euclidean_mst_lengths(row_distances(points))
    return float(np.power(edges[edges > 0], alpha).sum())


def usable_sizes(n_points: int, sizes: Sequence[int]) -> tuple[int, ...]:
    """The distinct subsample sizes of ``sizes`` between :data:`MIN_SIZE` and ``n_points``, ascending."""
    return tuple(sorted({int(s) for s in sizes if MIN_SIZE <= int(s) <= n_points}))


def ph_dimension(
    points: np.ndarray, sizes: Sequence[int], alpha: float = 1.0, seed: int = 0, draws: int = 1
) -> PHDimension:
    """The PH0 dimension of a cloud ``points`` (n, d), from subsamples of each size in ``sizes``.

    Parameters
    ----------
    points : (n, d) array
        The cloud (e.g. sketched iterates of a training run); any units: the estimate does not depend on
        a scaling, rotation or translation of the cloud.
    sizes : sequence of int
        Subsample sizes; those outside ``[MIN_SIZE, n]`` are dropped, and at least :data:`MIN_SIZES`
        distinct ones must remain. A size equal to ``n`` takes the whole cloud.
    alpha : float
        The exponent of the lifetimes, > 0; it must be below the cloud's true dimension (module docstring).
    seed, draws : int
        Each size's ``E_alpha`` is the mean over ``draws`` subsamples drawn without replacement by
        ``numpy.random.default_rng(seed)`` (one generator, sizes in ascending order).

    Returns
    -------
    PHDimension
        ``alpha / (1 - m)`` with ``m`` the least-squares slope of ``log E_alpha`` against ``log n``; NaN with
        a reason when there are too few points or sizes, the points are not finite, all points coincide, or
        the slope is not below 1.
    """
    if not alpha > 0:
        raise ValueError(f"alpha must be positive, got {alpha}")
    if draws < 1:
        raise ValueError(f"draws must be at least 1, got {draws}")
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2:
        raise ValueError(f"points must be an (n, d) array, got shape {points.shape}")
    n = points.shape[0]
    use = usable_sizes(n, sizes)

    def null(reason: str, slope: float = np.nan) -> PHDimension:
        return PHDimension(np.nan, slope, use, n, reason)

    if not np.isfinite(points).all():
        return null("non-finite coordinates")
    if len(use) < MIN_SIZES:
        return null(
            f"{n} points allow {len(use)} subsample sizes between {MIN_SIZE} and {n}, "
            f"fewer than the {MIN_SIZES} a slope is fitted through"
        )
    rng = np.random.default_rng(seed)
    weights = []
    for size in use:
        draws_here = 1 if size == n else draws  # the whole cloud is the same set every draw
        total = 0.0
        for _ in range(draws_here):
            rows = np.arange(n) if size == n else rng.choice(n, size, replace=False)
            total += h0_alpha_weight(points[rows], alpha)
        weights.append(total / draws_here)
    weights = np.asarray(weights)
    if not (weights > 0).all():
        return null("the points coincide (no H0 persistence at some sample size)")
    slope = float(np.polyfit(np.log(use), np.log(weights), 1)[0])
    if slope >= 1:
        return null(f"the slope of log E_alpha on log n is {slope:.3g}, not below 1", slope)
    return PHDimension(alpha / (1.0 - slope), slope, use, n)


def trailing_dimension(
    steps: np.ndarray,
    points: np.ndarray,
    at_step: int,
    window: int,
    sizes: Sequence[int],
    alpha: float = 1.0,
    seed: int = 0,
    draws: int = 1,
) -> PHDimension:
    """The PH0 dimension of a trajectory's iterates in the trailing window ``(at_step - window, at_step]``.

    ``steps`` (n,) are the training steps of the iterates ``points`` (n, d) (a run's sketch,
    :func:`topometrics.training.sketch.read_sketch`, or its checkpoints' flattened weights); the rest as
    :func:`ph_dimension`, whose NULL (with the window named in the reason) a window of too few iterates gets.
    """
    steps = np.asarray(steps)
    inside = (steps > at_step - window) & (steps <= at_step)
    est = ph_dimension(np.asarray(points)[inside], sizes, alpha, seed, draws)
    if est.reason is None:
        return est
    return est._replace(reason=f"steps {at_step - window + 1}..{at_step}: {est.reason}")
