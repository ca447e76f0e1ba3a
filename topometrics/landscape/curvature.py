"""Curvature from Hessian-vector products: the top eigenvalues (Lanczos) and the trace (Hutchinson).

Both take the Hessian only as an operator ``hvp(v) -> H v`` on float64 vectors of length ``dim`` (or float32, a
large model's: ``top_eigenpairs``' ``dtype``), so
they serve any loss whose Hessian-vector products can be computed (double backward, ``torch.func``)
and are tested against explicit matrices. Randomness comes only from ``seed``.

- :func:`top_eigenpairs`: Lanczos from a seeded Gaussian start; the ``k`` largest (algebraic) Ritz
  values, their vectors, and whether each has converged: the Lanczos residual bound ``|beta_m * s_{m,i}|``
  is at most ``tol * max(1, |theta_i|)``. With ``stop_early`` the bound is checked after every step and the
  run stops as soon as all ``k`` have converged (the same test as at the end, so an early stop returns
  exactly what a run cut at that step would). Memory: while the ``(steps, dim)`` float64 basis fits
  ``basis_bytes`` it is kept and every step is fully re-orthogonalised against it (one product a step);
  beyond that (a Pythia-160M basis of 20 steps is 26 GB) the basis is not kept: a first pass runs the
  three-term recurrence (locally re-orthogonalised) for the tridiagonal matrix, a second pass regenerates
  the same Lanczos vectors to sum the Ritz vectors (float32: the slice they span is taken in the weights'
  float32), so memory is three float64 vectors and ``k`` float32 ones whatever the steps, for about twice the
  products. With ``dtype`` float32 (the products of a model too large for float64 copies,
  :func:`topometrics.landscape.slice.exact_hvp`) the three vectors are float32 (dots accumulated in float64,
  :mod:`topometrics.landscape.vectors`), and with ``spill`` (an ``ExitStack`` that closes them) the ``k`` Ritz
  vectors are summed in an unnamed file (:class:`~topometrics.landscape.vectors.FileRows`) instead of memory,
  the current and the previous Lanczos vectors wait in two more files (the product reads the current one a
  part at a time, the recurrence reads both a chunk at a time: a large model's product is the run's peak), and
  the start vector is drawn again for the second pass instead of kept: one float32 vector of the model's size,
  the product's result, in memory at any time. Without full re-orthogonalisation a converged Ritz value can
  reappear as a spurious copy (Paige); a vector whose cosine with a higher one exceeds ``sqrt(tol)`` is
  reported as not converged.
- :func:`hutchinson_trace`: the mean of ``z^T H z`` over ``probes`` seeded Rademacher vectors
  (``E[z z^T] = I``, so the mean is unbiased; exact on a diagonal Hessian, whatever the probes),
  with its standard error.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from topometrics.landscape.vectors import (
    FileRows,
    Vector,
    add_rows,
    axpy,
    dot,
    file_rows,
    gram,
    norm,
    read_row,
    scale_rows,
    write_row,
)

# ``v -> H v``; given a vector in a file (the two-pass path with a spill) it reads it a part at a time
Operator = Callable[[Vector], np.ndarray]


class Eigenpairs(NamedTuple):
    values: np.ndarray  # (k,) largest eigenvalues, descending
    # (dim, k) unit eigenvectors, column i for values[i] (float32 on the two-pass path), or their k rows in a file
    vectors: np.ndarray | FileRows
    converged: np.ndarray  # (k,) bool: the residual bound is within tolerance
    products: int  # Hessian-vector products spent

    def vector(self, i: int) -> np.ndarray:
        """Eigenvector ``i`` as a ``(dim,)`` array, wherever the vectors are kept."""
        if isinstance(self.vectors, FileRows):
            return read_row(self.vectors, i)
        return self.vectors[:, i]


class TraceEstimate(NamedTuple):
    trace: float
    stderr: float  # standard error of the mean over probes (0 for one probe)
    products: int


class Lanczos(NamedTuple):
    """What one Lanczos run is asked for: the top ``k`` eigenpairs from at most ``steps`` Hessian-vector steps,
    each converged when its residual bound is within ``tol`` (relative, see :func:`_ritz`); ``stop_early``
    ends the run as soon as all ``k`` have converged."""

    k: int
    steps: int
    tol: float
    stop_early: bool


# The largest Lanczos basis kept in memory, in bytes (float64): every ladder model's 20-step basis (tens of
# MB) stays on the one-pass path; a Pythia-70M-shaped one (20 x 70M x 8 bytes = 11 GB) goes to two passes.
BASIS_BYTES = 1 << 30


def top_eigenpairs(
    hvp: Operator,
    dim: int,
    k: int,
    iters: int = 30,
    seed: int = 0,
    tol: float = 1e-6,
    stop_early: bool = False,
    basis_bytes: int = BASIS_BYTES,
    dtype: type = np.float64,
    spill: contextlib.ExitStack | None = None,
) -> Eigenpairs:
    """The ``k`` largest eigenvalues of the symmetric operator ``hvp`` on R^dim, by ``iters`` Lanczos steps.

    Stops early when the Krylov space is exhausted (an invariant subspace: every Ritz value is then
    exact) and, with ``stop_early``, as soon as the top ``k`` Ritz values have converged to ``tol``
    (checked from step ``k`` on; one ``(m, m)`` tridiagonal eigendecomposition a step, no product).
    ``k`` must not exceed ``min(iters, dim)``. A basis over ``basis_bytes`` is not kept (module docstring);
    ``dtype`` (the Lanczos vectors', float32 or float64) and ``spill`` (the stack that closes the files of the
    Ritz vectors and of the Lanczos vectors; the caller closes it once done with the vectors) serve that
    two-pass path only.
    """
    if not 1 <= k <= min(iters, dim):
        raise ValueError(f"k = {k} eigenvalues need 1 <= k <= min(iters, dim) = {min(iters, dim)}")
    run = Lanczos(k, min(iters, dim), tol, stop_early)
    if keeps_basis(run.steps, dim, basis_bytes):
        q = np.random.default_rng(seed).standard_normal(dim)
        return _kept_basis(hvp, q / np.linalg.norm(q), run)

    def start() -> np.ndarray:  # the same vector each call: the second pass draws it again instead of keeping it
        rng, q = np.random.default_rng(seed), np.empty(dim, dtype=dtype)
        for at in range(0, dim, 1 << 22):  # a chunk at a time: no float64 vector of a float32 run
            q[at : at + (1 << 22)] = rng.standard_normal(min(1 << 22, dim - at))
        q /= norm(q)
        return q

    return _two_pass(hvp, dim, start, run, spill)


def keeps_basis(steps: int, dim: int, basis_bytes: int = BASIS_BYTES) -> bool:
    """Whether a Lanczos run of ``steps`` on R^dim keeps its float64 basis (within ``basis_bytes``)."""
    return steps * dim * 8 <= basis_bytes


def _kept_basis(hvp: Operator, q: np.ndarray, run: Lanczos) -> Eigenpairs:
    """Lanczos with full re-orthogonalisation against the kept ``(steps, dim)`` basis."""
    k, steps, tol, _ = run
    basis = np.empty((steps, len(q)))  # row j: the j-th Lanczos vector, filled in place (no copy per step)
    basis[0] = q
    alphas, betas = [], []
    for j in range(steps):
        w = np.asarray(hvp(basis[j]), dtype=np.float64)
        alphas.append(float(basis[j] @ w))
        stacked = basis[: j + 1]
        w = w - (stacked @ w) @ stacked  # full re-orthogonalisation, twice (floating point drifts)
        w = w - (stacked @ w) @ stacked
        beta = float(np.linalg.norm(w))
        betas.append(beta)
        if _stop(alphas, betas, run, j + 1 == steps):
            break
        basis[j + 1] = w / beta
    theta, s, converged = _checked_ritz(alphas, betas, k, tol)
    vectors = basis[: len(alphas)].T @ s
    return Eigenpairs(theta, vectors / np.linalg.norm(vectors, axis=0), converged, len(alphas))


def _two_pass(
    hvp: Operator, dim: int, start: Callable[[], np.ndarray], run: Lanczos, spill: contextlib.ExitStack | None = None
) -> Eigenpairs:
    """Lanczos keeping three vectors (the dtype of ``start()``, the unit start vector): the recurrence for the
    tridiagonal matrix, then again for the Ritz vectors. With ``spill`` (the caller's stack, which closes the
    files: :func:`~topometrics.landscape.vectors.file_rows`), the Lanczos vectors wait in two unnamed files
    (the current and the previous one, taking turns), ``hvp`` is given the current one's file
    to read as it goes (:class:`~topometrics.landscape.vectors.FileRows`), the recurrence reads both a chunk at a
    time, and the Ritz vectors are summed in a third file: the product's result is the one vector in memory."""
    k, steps, tol, _ = run
    alphas, betas = [], []
    kept = _keeper(spill, dim)
    previous, current = None, kept(start(), 0)
    most = min(2 * steps, dim)
    for j in range(most):  # first pass: the coefficients only
        alpha, w = _recurrence_step(hvp, previous, current, betas[-1] if betas else 0.0)
        alphas.append(alpha)
        betas.append(norm(w))
        # a step spent on a spurious copy adds no dimension to the Krylov space: it does not count
        last = len(alphas) - _spurious(alphas, betas, tol) >= steps or len(alphas) == most
        if _stop(alphas, betas, run, last, genuine=True):
            break
        w /= betas[-1]
        previous, current, w = current, kept(w, j + 1), None  # w in a file now, with a spill: not held
    del previous, current, w
    theta, s, converged = _checked_ritz(alphas, betas, k, tol, genuine=True)
    m = len(alphas)
    # row i: Ritz vector i, summed as the vectors come back
    sums = file_rows(spill, k, dim) if spill is not None else np.zeros((k, dim), dtype=np.float32)
    previous, current = None, kept(start(), 0)
    for j in range(m):  # second pass: the same vectors (the same products), summed with the Ritz coordinates
        if spill is not None:
            add_rows(sums, s[j], current)
        else:
            for i in range(k):
                sums[i] += np.float32(s[j, i]) * current.astype(np.float32)
        if j + 1 < m:
            _, w = _recurrence_step(hvp, previous, current, betas[j - 1] if j else 0.0)
            w /= betas[j]
            previous, current, w = current, kept(w, j + 1), None
    del previous, current
    if spill is not None:
        products = gram(sums)
        lengths = np.sqrt(np.diag(products))
        scale_rows(sums, np.diag(1.0 / lengths))
        cosines = np.abs(np.triu(products / np.outer(lengths, lengths), 1))
        vectors = sums
    else:
        sums /= np.linalg.norm(sums, axis=1, keepdims=True)  # in place: no second copy of k parameter vectors
        cosines = np.abs(np.triu(sums @ sums.T, 1)).astype(np.float64)
        vectors = sums.T
    converged &= cosines.max(axis=0, initial=0.0) <= np.sqrt(tol)  # a spurious copy of a higher Ritz vector
    return Eigenpairs(theta, vectors, converged, 2 * m - 1)


def _keeper(spill: contextlib.ExitStack | None, dim: int) -> Callable[[np.ndarray, int], Vector]:
    """``(vector, j) -> `` the ``j``-th Lanczos vector as the recurrence keeps it: itself, or with a ``spill``
    stack written to one of two unnamed files (``j`` even, ``j`` odd: vector ``j + 1`` overwrites ``j - 1``, which the
    recurrence no longer needs) and the file in its stead."""
    if spill is None:
        return lambda vector, j: vector
    files = [file_rows(spill, 1, dim) for _ in range(2)]
    return lambda vector, j: write_row(files[j % 2], 0, vector)


def _recurrence_step(hvp: Operator, previous: Vector | None, current: Vector, beta: float) -> tuple[float, np.ndarray]:
    """``(alpha_j, w)``: ``w = H q_j - alpha_j q_j - beta_{j-1} q_{j-1}``, once more orthogonalised against both
    (local re-orthogonalisation keeps the two-pass vectors as orthogonal as floating point lets them be).
    In place (BLAS axpy) in ``current``'s dtype (float32 for a vector in a file, read a chunk at a time): no
    temporary vector beyond the product itself."""
    dtype = np.float32 if isinstance(current, FileRows) else current.dtype
    w = np.asarray(hvp(current), dtype=dtype)
    shared = not isinstance(current, FileRows) and np.may_share_memory(w, current)
    if not w.flags.c_contiguous or w.flags.writeable is False or shared:
        w = np.array(w, dtype=dtype)  # never update the caller's (or our own) vector in place
    alpha = dot(current, w)
    w = axpy(current, w, -alpha)
    if previous is not None:
        w = axpy(previous, w, -beta)
        w = axpy(previous, w, -dot(previous, w))
    w = axpy(current, w, -dot(current, w))
    return alpha, w


def _stop(alphas: list[float], betas: list[float], run: Lanczos, last: bool, genuine=False) -> bool:
    """Whether the run ends after this step: an invariant subspace, the ``last`` step, or (``stop_early``) converged."""
    if betas[-1] <= 1e-12 * max(1.0, abs(alphas[-1])) or last:
        return True
    if not run.stop_early or len(alphas) < run.k:
        return False
    converged = _ritz(alphas, betas, run.k, run.tol, genuine)[2]
    return len(converged) == run.k and bool(converged.all())


def _spurious(alphas: list[float], betas: list[float], tol: float) -> int:
    """How many Ritz values after these steps are spurious copies (:func:`_genuine`)."""
    return len(alphas) - len(_ritz(alphas, betas, len(alphas), tol, genuine=True)[0])


def _checked_ritz(alphas: list[float], betas: list[float], k: int, tol: float, genuine: bool = False):
    theta, s, converged = _ritz(alphas, betas, k, tol, genuine)
    if len(theta) < k:
        raise ValueError(f"the Krylov space has dimension {len(alphas)} < k = {k}")
    return theta, s, converged


def _ritz(
    alphas: list[float], betas: list[float], k: int, tol: float, genuine: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The top ``k`` Ritz values (descending), their ``(m, k)`` coordinates in the Lanczos basis and whether
    each has converged (residual bound ``|beta_m s_{m,i}| <= tol max(1, |theta_i|)``), after ``m`` steps.

    ``genuine`` (vectors not re-orthogonalised): only :func:`_genuine` Ritz values are ranked."""
    m = len(alphas)
    tridiagonal = np.diag(alphas) + np.diag(betas[: m - 1], 1) + np.diag(betas[: m - 1], -1)
    theta, s = np.linalg.eigh(tridiagonal)
    order = np.argsort(theta)[::-1]
    residual = np.abs(betas[m - 1] * s[m - 1])
    if genuine:
        order = _genuine(theta, residual, order, tridiagonal, tol)
    top = order[:k]
    return theta[top], s[:, top], residual[top] <= tol * np.maximum(1.0, np.abs(theta[top]))


def _genuine(
    theta: np.ndarray, residual: np.ndarray, order: np.ndarray, tridiagonal: np.ndarray, tol: float
) -> np.ndarray:
    """``order`` less the spurious Ritz values of a Lanczos run without re-orthogonalisation (Cullum and
    Willoughby, "Lanczos algorithms for large symmetric eigenvalue computations", 1985, ch. 4).

    Lost orthogonality makes converged eigenvalues reappear: a numerically multiple Ritz value is one
    eigenvalue (kept once, the copy with the smallest residual bound), and a simple one that is also an
    eigenvalue of the matrix less its first row and column is spurious. "Numerically": within
    ``1000 m eps ||T||``; spurious copies sit at a few ``eps ||T||``, genuine values about ``s_{1,i}^2`` times
    their gap away (``s_{1,i}`` the start vector's component, ``1/sqrt(dim)`` for a random start).
    Products by differences of gradients are not exactly linear, so copies there differ by more than that:
    a value within ``tol max(1, |theta|)`` of a higher converged one is also taken for its copy (the two-pass
    path does not resolve eigenvalues closer than the tolerance to a converged one).
    """
    m = len(theta)
    close = 1e3 * m * np.finfo(np.float64).eps * max(float(np.abs(theta).max()), np.finfo(np.float64).tiny)
    hat = np.linalg.eigvalsh(tridiagonal[1:, 1:]) if m > 1 else np.empty(0)
    kept: list[int] = []
    for i in order:
        near = tol * np.maximum(1.0, np.abs(theta[kept]))
        if np.any((np.abs(theta[kept] - theta[i]) <= near) & (residual[kept] <= near)):
            continue  # a copy of a converged eigenvalue, at the tolerance
        copies = np.flatnonzero(np.abs(theta - theta[i]) <= close)
        if len(copies) > 1:
            if not any(j in copies for j in kept):
                kept.append(int(copies[np.argmin(residual[copies])]))
        elif not (len(hat) and np.abs(hat - theta[i]).min() <= close):
            kept.append(int(i))
    return np.array(kept, dtype=int)


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
