"""Decisions and the noise ceiling: numbers that put a final-loss predictor on the scale a user meets.

- :func:`pair_order_accuracy`: the share of run pairs a predictor orders as their final losses are
  ordered ("which of two runs ends better?"; DataDecide, 2025, reports about 80 % for ranking by the
  current loss).
- :func:`noise_ceiling`: the pooled within-cell (rung x recipe) standard deviation of the final loss,
  the seed-to-seed spread no predictor from a run's recipe can beat.
- :func:`robust_z` and :func:`outlier_runs`: runs that end far worse than the other seeds of their cell.

Pure functions of arrays: one entry per run, NaN for a run with no number.
"""

from __future__ import annotations

import numpy as np

MAD_TO_SD = 1.4826  # the median absolute deviation times this estimates the SD of a normal sample


def pair_order_accuracy(predicted, final, within=None) -> float:
    """Share of run pairs whose order by ``predicted`` is their order by ``final`` loss.

    Parameters
    ----------
    predicted, final : array_like, shape (n_runs,)
        A predictor's value per run (any scale; only the order counts) and the final loss.
    within : array_like, shape (n_runs,), optional
        Group labels (e.g. the rung): only pairs of the same group count. None: every pair.

    Ties: a pair tied in ``final`` has no right order and is not counted; a pair the predictor ties
    counts one half (a coin flip). A pair with a non-finite value in either array is not counted.
    Without ties the share is (1 + tau) / 2, tau = Kendall's rank correlation of the two arrays.

    Returns
    -------
    float
        In [0, 1]; NaN when no pair is counted.
    """
    p, f = np.asarray(predicted, dtype=float), np.asarray(final, dtype=float)
    if p.shape != f.shape or p.ndim != 1:
        raise ValueError(f"predicted and final must be 1-D arrays of one length, got {p.shape} and {f.shape}")
    ok = np.isfinite(p) & np.isfinite(f)
    counted = np.triu(ok[:, None] & ok[None, :], k=1)  # each unordered pair once
    if within is not None:
        groups = np.asarray(within)
        counted &= groups[:, None] == groups[None, :]
    with np.errstate(invalid="ignore"):
        sign_f = np.sign(f[:, None] - f[None, :])
        sign_p = np.sign(p[:, None] - p[None, :])
    counted &= sign_f != 0
    if not counted.any():
        return float("nan")
    score = np.where(sign_p == 0, 0.5, (sign_p == sign_f).astype(float))
    return float(score[counted].mean())


def noise_ceiling(final_loss, cells) -> float:
    """Pooled within-cell standard deviation of the final loss.

    sqrt( sum over cells of sum_i (x_i - mean of the cell)^2 / sum over cells of (n_cell - 1) ): the
    one-way ANOVA's within-group root mean square, so every cell's seeds count in proportion to their
    degrees of freedom. Non-finite losses are left out; a cell of one run adds no degree of freedom.

    Parameters
    ----------
    final_loss : array_like, shape (n_runs,)
        Final validation loss per run (nats).
    cells : array_like, shape (n_runs,)
        The run's cell label (e.g. ``"small|wsd"``): runs that differ only by seed share a cell.

    Returns
    -------
    float
        In nats; NaN when no cell has two runs.
    """
    x, labels = _finite_by_cell(final_loss, cells)
    squares, dof = 0.0, 0
    for label in np.unique(labels):
        values = x[labels == label]
        squares += float(((values - values.mean()) ** 2).sum())
        dof += len(values) - 1
    return float(np.sqrt(squares / dof)) if dof > 0 else float("nan")


def robust_z(final_loss, cells) -> np.ndarray:
    """How far each run's final loss lies above the other runs of its cell, in robust SDs.

    (x_i - median of the others) / (1.4826 x their median absolute deviation): the run itself is left
    out, so an outlier does not widen its own yardstick. NaN with fewer than 3 other finite runs in
    the cell, or when the others' deviation is 0 (no scale to measure by).

    Returns
    -------
    ndarray, shape (n_runs,)
        Positive = worse (higher loss) than the cell's others.
    """
    x, labels = _checked(final_loss, cells)
    z = np.full(x.shape, np.nan)
    for i in np.flatnonzero(np.isfinite(x)):
        others = x[(labels == labels[i]) & np.isfinite(x) & (np.arange(len(x)) != i)]
        if len(others) < 3:
            continue
        centre = np.median(others)
        scale = MAD_TO_SD * np.median(np.abs(others - centre))
        if scale > 0:
            z[i] = (x[i] - centre) / scale
    return z


def outlier_runs(final_loss, cells, k: float = 3.0) -> np.ndarray:
    """Runs whose final loss is more than ``k`` robust SDs worse than their cell's others (:func:`robust_z`).

    Returns
    -------
    ndarray of bool, shape (n_runs,)
        False where :func:`robust_z` is NaN (too few others, or no spread among them).
    """
    if not k > 0:
        raise ValueError(f"k must be a positive number of robust SDs, got {k}")
    z = robust_z(final_loss, cells)
    return np.nan_to_num(z, nan=-np.inf) > k


def _checked(values, cells) -> tuple[np.ndarray, np.ndarray]:
    """The losses as floats and the cell labels, refused unless both are 1-D of one length."""
    x, labels = np.asarray(values, dtype=float), np.asarray(cells)
    if x.shape != labels.shape or x.ndim != 1:
        raise ValueError(f"final_loss and cells must be 1-D arrays of one length, got {x.shape} and {labels.shape}")
    return x, labels


def _finite_by_cell(values, cells) -> tuple[np.ndarray, np.ndarray]:
    x, labels = _checked(values, cells)
    keep = np.isfinite(x)
    return x[keep], labels[keep]
