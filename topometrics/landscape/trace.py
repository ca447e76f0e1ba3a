"""The Hessian's trace to a stated precision: exact on a small model, adaptive Hutchinson on a larger one.

Like :mod:`topometrics.landscape.curvature`, the Hessian enters only as an operator ``hvp(v) -> H v`` on float64
vectors of length ``dim``; randomness comes only from ``seed``.

- :func:`exact_trace`: ``sum_i (H e_i)_i``, one product per parameter; no sampling error (``stderr`` 0), only
  the products' own (about 1e-7 relative for the one-sided float64 differences the features use).
- :func:`adaptive_trace`: Hutchinson's mean of ``z^T H z`` over seeded Rademacher probes, drawn until its
  standard error is at most ``rse`` of the estimate's magnitude (checked from ``min_probes`` on) or
  ``max_probes`` are spent. With an orthonormal ``basis`` ``V`` (the Lanczos top eigenvectors, already
  computed) it is deflated: ``tr(H) = tr(V^T H V) + tr(P H P)``, ``P = I - V V^T``, the first term exact
  (``k`` products), the second Hutchinson's on ``P z``. Both terms are unbiased whatever ``V`` is; when ``V``
  holds the top eigendirections the probes no longer see the outlying eigenvalues, which dominate
  Hutchinson's variance ``2 sum_{i != j} h_ij^2`` on a network's Hessian (docs/performance.md).
- :func:`hessian_trace`: exact when ``dim <= exact_max``, else adaptive.

The stopping rule reads the same probes it stops on, so the reported standard error is a slight
underestimate near the threshold; tests check that the realised error over many seeds is within the target.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from topometrics.landscape.curvature import TraceEstimate
from topometrics.landscape.vectors import (
    FileRows,
    Vector,
    dot,
    file_rows,
    orthonormalise,
    project_out,
    read_row,
    write_row,
)

Operator = Callable[[Vector], np.ndarray]


class Probes(NamedTuple):
    """Hutchinson's probe budget: probes are drawn until the standard error is at most ``rse`` of the trace's
    magnitude, checked from ``min_probes`` (>= 2) on, and never beyond ``max_probes``."""

    min_probes: int
    rse: float  # the target relative standard error (> 0)
    max_probes: int  # the cap: a trace that reaches it may miss the target, and its stderr says so


def exact_trace(hvp: Operator, dim: int) -> TraceEstimate:
    """``tr(H) = sum_i e_i^T H e_i`` from ``dim`` products with the unit vectors; ``stderr`` 0."""
    total, unit = 0.0, np.zeros(dim)
    for i in range(dim):
        unit[i] = 1.0
        total += float(np.asarray(hvp(unit), dtype=np.float64)[i])
        unit[i] = 0.0
    return TraceEstimate(total, 0.0, dim)


def adaptive_trace(
    hvp: Operator,
    dim: int,
    probes: Probes,
    seed: int = 0,
    basis: np.ndarray | FileRows | None = None,
    dtype: type = np.float64,
) -> TraceEstimate:
    """Hutchinson's trace, probes added until ``stderr <= rse * |trace|`` (from ``min_probes`` on) or ``max_probes``.

    ``basis``: ``(dim, k)`` vectors to deflate with (orthonormalised here); ``products`` counts the ``k``
    exact ones too; rows in a file (the curvature's float32 path) are orthonormalised there, in place, and applied a
    chunk at a time, and each vector ``hvp`` runs on is given to it in a file beside them (``hvp`` must read a
    one-row :class:`~topometrics.landscape.vectors.FileRows`, as ``slice.exact_hvp`` does). ``dtype`` float32: the
    probes are float32 (a model too large for float64 copies; dots are still accumulated in float64). ``stderr``
    is the probes' standard error of the mean (ddof 1).
    """
    min_probes, rse, max_probes = probes
    if not 2 <= min_probes <= max_probes:
        raise ValueError(f"probes need 2 <= min_probes <= max_probes, got {min_probes} and {max_probes}")
    if rse <= 0:
        raise ValueError(f"the target relative standard error must be positive, got {rse}")
    with contextlib.ExitStack() as files:  # closes the probes' file, if any
        exact_part, project, kept, spent = 0.0, (lambda v: v), (lambda v: v), 0
        if isinstance(basis, FileRows):
            orthonormalise(basis)
            # each vector a product runs on waits in an unnamed file (closed on return) and the product reads it
            # in parts (slice.exact_hvp): the product's result is the one vector of the model's size held through
            # a product
            kept = functools.partial(write_row, file_rows(files, 1, dim), 0)

            exact_part = sum(dot(q, hvp(q)) for q in (kept(read_row(basis, j)) for j in range(basis.rows)))
            spent = basis.rows

            def project(v: np.ndarray) -> np.ndarray:
                return project_out(basis, v)

        elif basis is not None and basis.shape[1]:
            q, _ = np.linalg.qr(np.asarray(basis, dtype=np.float64))
            exact_part = sum(float(q[:, j] @ np.asarray(hvp(q[:, j]), dtype=np.float64)) for j in range(q.shape[1]))
            spent = q.shape[1]

            def project(v: np.ndarray) -> np.ndarray:
                return v - q @ (q.T @ v)

        rng = np.random.default_rng(seed)
        n, mean, m2 = 0, 0.0, 0.0  # Welford's running mean and sum of squared deviations of the probes
        while n < max_probes:
            if dtype == np.float64:
                z = project(rng.integers(0, 2, dim).astype(np.float64) * 2.0 - 1.0)
                sample = float(z @ np.asarray(hvp(z), dtype=np.float64))  # z = P z: z^T H z = z^T P H P z
            else:  # in place: one float32 vector (and the int8 draw) besides the product
                z = rng.integers(0, 2, dim, dtype=np.int8).astype(dtype)
                z *= 2
                z -= 1
                z = kept(project(z))
                sample = dot(z, np.asarray(hvp(z), dtype=dtype))
            n += 1
            delta = sample - mean
            mean += delta / n
            m2 += delta * (sample - mean)
            stderr = float(np.sqrt(m2 / (n - 1) / n)) if n > 1 else np.inf
            if n >= min_probes and stderr <= rse * abs(exact_part + mean):
                break
        return TraceEstimate(exact_part + mean, stderr, spent + n)


def hessian_trace(
    hvp: Operator,
    dim: int,
    exact_max: int,
    probes: Probes,
    seed: int = 0,
    basis: np.ndarray | FileRows | None = None,
    dtype: type = np.float64,
) -> TraceEstimate:
    """:func:`exact_trace` when ``dim <= exact_max``, else :func:`adaptive_trace`."""
    if dim <= exact_max:
        return exact_trace(hvp, dim)
    return adaptive_trace(hvp, dim, probes, seed, basis, dtype)
