"""Curvature from Hessian-vector products: the top eigenvalues (Lanczos) and the trace (Hutchinson).

Both take the Hessian only as an operator ``hvp(v) -> H v`` on float64 vectors of length ``dim``, so
they serve any loss whose Hessian-vector products can be computed (double backward, ``torch.func``)
and are tested against explicit matrices. Randomness comes only from ``seed``.

- :func:`top_eigenpairs`: Lanczos with full re-orthogonalisation from a seeded Gaussian start; the
  ``k`` largest (algebraic) Ritz values, their vectors, and whether each has converged: the Lanczos
  residual bound ``|beta_m * s_{m,i}|`` is at most ``tol * max(1, |theta_i|)``. With ``stop_early`` the
  bound is checked after every step and the run stops as soon as all ``k`` have converged (the same test
  as at the end, so an early stop returns exactly what a run cut at that step would).
- :func:`hutchinson_trace`: the mean of ``z^T H z`` over ``probes`` seeded Rademacher vectors
  (``E[z z^T] = I``, so the mean is unbiased; exact on a diagonal Hessian, whatever the probes),
  with its standard error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

Operator = Callable[[np.ndarray], np.ndarray]


class Eigenpairs(NamedTuple):
    values: np.ndarray  # (k,) largest eigenvalues, descending
    vectors: np.ndarray  # (dim, k) unit eigenvectors, column i for values[i]
    converged: np.ndarray  # (k,) bool: the residual bound is within tolerance
    products: int  # Hessian-vector products spent


class TraceEstimate(NamedTuple):
    trace: float
    stderr: float  # standard error of the mean over probes (0 for one probe)
    products: int


def top_eigenpairs(
    hvp: Operator, dim: int, k: int, iters: int = 30, seed: int = 0, tol: float = 1e-6, stop_early: bool = False
) -> Eigenpairs:
    """The ``k`` largest eigenvalues of the symmetric operator ``hvp`` on R^dim, by ``iters`` Lanczos steps.

    Stops early when the Krylov space is exhausted (an invariant subspace: every Ritz value is then
    exact) and, with ``stop_early``, as soon as the top ``k`` Ritz values have converged to ``tol``
    (checked from step ``k`` on; one ``(m, m)`` tridiagonal eigendecomposition a step, no product).
    ``k`` must not exceed ``min(iters, dim)``.
    """
    if not 1 <= k <= min(iters, dim):
        raise ValueError(f"k = {k} eigenvalues need 1 <= k <= min(iters, dim) = {min(iters, dim)}")
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(dim)
    steps = min(iters, dim)
    basis = np.empty((steps, dim))  # row j: the j-th Lanczos vector, filled in place (no copy per step)
    basis[0] = q / np.linalg.norm(q)
    alphas, betas = [], []
    for j in range(steps):
        w = np.asarray(hvp(basis[j]), dtype=np.float64)
        alphas.append(float(basis[j] @ w))
        stacked = basis[: j + 1]
        w = w - (stacked @ w) @ stacked  # full re-orthogonalisation, twice (floating point drifts)
        w = w - (stacked @ w) @ stacked
        beta = float(np.linalg.norm(w))
        betas.append(beta)
        if beta <= 1e-12 * max(1.0, abs(alphas[-1])) or j + 1 == steps:
            break
        if stop_early and j + 1 >= k and _ritz(alphas, betas, k, tol)[2].all():
            break
        basis[j + 1] = w / beta
    m = len(alphas)
    theta, s, converged = _ritz(alphas, betas, k, tol)
    if len(theta) < k:
        raise ValueError(f"the Krylov space has dimension {m} < k = {k}")
    vectors = basis[:m].T @ s
    return Eigenpairs(theta, vectors / np.linalg.norm(vectors, axis=0), converged, m)


def _ritz(alphas: list[float], betas: list[float], k: int, tol: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The top ``k`` Ritz values (descending), their ``(m, k)`` coordinates in the Lanczos basis and whether
    each has converged (residual bound ``|beta_m s_{m,i}| <= tol max(1, |theta_i|)``), after ``m`` steps."""
    m = len(alphas)
    tridiagonal = np.diag(alphas) + np.diag(betas[: m - 1], 1) + np.diag(betas[: m - 1], -1)
    theta, s = np.linalg.eigh(tridiagonal)
    top = np.argsort(theta)[::-1][:k]
    residual = np.abs(betas[m - 1] * s[m - 1, top])
    return theta[top], s[:, top], residual <= tol * np.maximum(1.0, np.abs(theta[top]))


def hutchinson_trace(hvp: Operator, dim: int, probes: int, seed: int = 0) -> TraceEstimate:
    """Hutchinson's estimate of tr(H) from ``probes`` seeded Rademacher vectors."""
    if probes < 1:
        raise ValueError(f"probes must be at least 1, got {probes}")
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(probes):
        z = rng.integers(0, 2, dim).astype(np.float64) * 2.0 - 1.0
        samples.append(float(z @ np.asarray(hvp(z), dtype=np.float64)))
    stderr = float(np.std(samples, ddof=1) / np.sqrt(probes)) if probes > 1 else 0.0
    return TraceEstimate(float(np.mean(samples)), stderr, probes)
