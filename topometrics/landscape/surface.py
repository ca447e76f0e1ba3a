"""The loss surface of one checkpoint on its fixed batch: the slices' topology and the Hessian's curvature.

:func:`surface_values` runs, for a loss of parameters (:func:`topometrics.landscape.slice.functional_loss`)
at the checkpoint's weights:

1. Lanczos on Hessian-vector products (one-sided differences of float64 gradients, ``slice.difference_hvp``;
   a model whose Lanczos basis would exceed ``curvature.BASIS_BYTES`` — a Pythia-70M shape and up — takes exact
   float32 products instead, one window of the batch at a time, ``slice.exact_hvp``, with float32 Lanczos vectors
   and its Ritz vectors in a temporary file: :func:`large_model`; at most ``hessian_iters`` steps, stopping as
   soon as the kept Ritz values have converged, seed ``seed``)
   for the top ``max(hessian_top, 2)`` eigenpairs, and the trace (:func:`topometrics.landscape.trace.hessian_trace`:
   exact up to ``hessian_exact_max`` parameters, above that Hutchinson's with the top eigenvectors deflated and
   Rademacher probes added from ``hessian_probes`` until the standard error ``trace_se`` is ``hessian_trace_rse``
   of the trace, or ``hessian_probes_max`` are spent);
2. two ``landscape_grid`` x ``landscape_grid`` loss slices of half-width ``landscape_radius``: ``rand``
   along two seeded Gaussian directions, ``hess`` along the top-2 eigenvectors, both filter-normalised;
3. :func:`topometrics.landscape.sublevel.slice_summary` of each slice;
4. ``rand_range_global``: the loss range of the ``rand`` directions' slice at radius :data:`GLOBAL_RADIUS` on a
   coarse :data:`GLOBAL_GRID` x :data:`GLOBAL_GRID` grid (:func:`global_range`);
5. ``rand_curv``, ``hess_curv``: each slice's curvature ``d^T H d`` along its two directions at the weights
   (:func:`slice_curvature`), from the same products.

Every value set comes back with a reason or None; a reason makes its values NULL. Reasons: a Lanczos
run whose kept Ritz values did not converge (the residual bound above :data:`LANCZOS_TOL` relative) NULLs
the eigenvalues it concerns and the ``hess`` slice when the top two did not; a non-finite loss anywhere on
a slice NULLs that slice; a non-finite Hessian product NULLs the curvature, the ``hess`` slice and the
slices' ``curv``.
Keys are the vocabulary's, less the family prefix (``rand_minima``, ``eig1``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from topometrics.landscape.curvature import BASIS_BYTES, keeps_basis, top_eigenpairs
from topometrics.landscape.slice import (
    LossOfParams,
    Params,
    difference_hvp,
    exact_hvp,
    filter_normalised,
    loss_grid,
    random_direction,
    unflatten,
)
from topometrics.landscape.sublevel import SUMMARY_KEYS, slice_summary
from topometrics.landscape.trace import Probes, hessian_trace
from topometrics.landscape.vectors import FileRows, NoRoom, all_finite, dot, file_rows, write_part

# Relative Lanczos residual bound under which a Ritz value counts as converged: 1e-3 of the eigenvalue
# is far below the spread between checkpoints, and tens of steps reach it on our models' top eigenvalues.
LANCZOS_TOL = 1e-3
EIGEN_KEYS = ("eig1", "eig2", "eig3")
CURVATURE_KEYS = (*EIGEN_KEYS, "trace", "eig1_over_trace", "trace_se")
# Stacked parameter values one vmapped grid call may hold on a GPU (2^26 floats, 256 MiB in float32): the
# whole 13 x 13 grid of xl (97k parameters) in one forward pass, a few points at a time for a 19M-parameter
# model. On CPU the grid is a plain loop: one thread's CPU time per point was 0.42 forward+backward passes
# looped against 1.2-1.7 vmapped on the math kernel (xl, ``python -m bench features --surface``).
GRID_PARAMETERS = 1 << 26
# Half-width of the global random slice (rand_range_global), in filter-normalised units: radius 1 moves every
# weight row by its own norm, so its range is mostly the loss of a destroyed network (the features' old
# landscape_radius, kept under a name that says so); the local slices use landscape_radius.
GLOBAL_RADIUS = 1.0
# Points per axis of that slice: a, b in {-1, -1/2, 0, 1/2, 1}, a subset of a 13-point grid of the same radius, so
# its range is at most the fine grid's; on trained checkpoints the two agreed (docs/performance.md), at 25 points
# instead of 169. Part of the feature's definition, like the radius: a context column, not a tuned one.
GLOBAL_GRID = 5


class SurfaceSettings(NamedTuple):
    """The ``features.landscape_*`` and ``features.hessian_*`` params, and the seed."""

    grid: int
    radius: float
    top: int
    probes: int
    iters: int
    seed: int
    chunk: int = 0  # grid points per vmap call; 0: a plain loop on CPU, grid_chunk on a GPU
    exact_max: int = 10_000  # parameters up to which the trace is exact (one product per parameter)
    trace_rse: float = 0.05  # above it: Hutchinson probes until the standard error is this share of the trace
    probes_max: int = 400  # ... or this many probes (``probes`` is the least)


class Values(NamedTuple):
    values: dict[str, float]  # keys without the family prefix
    reasons: dict[str, str]  # key -> why its value is NULL (absent: computed)


def surface_values(
    loss: LossOfParams,
    params: Params,
    settings: SurfaceSettings,
    windows: Sequence[LossOfParams] = (),
    landscape: bool = True,
    curvature: bool = True,
) -> tuple[Values | None, Values | None]:
    """``(landscape, curvature)`` of ``loss`` at ``params``; see the module docstring. ``windows``: the same loss
    as the mean of one per window of its batch (``features.forward.LossSurface.windows``), which a large model's
    products take one at a time (default: ``loss`` whole). ``landscape`` / ``curvature`` False: that family is
    not computed (None in its place): without the curvature, the Hessian's trace is skipped (the ``hess`` slice
    still needs the top eigenvectors); without the landscape, the slices and the global range. A family's values
    are the same whether or not the other is computed (their draws are seeded apart)."""
    hvp, dim, dtype = curvature_products(loss, params, settings, windows)  # curvature_values' defaults, shared
    hvp = _finite(hvp)
    found_curvature, eig = _curvature_values(hvp, dim, params, settings, dtype=dtype, trace=curvature)
    if not landscape:
        return None, found_curvature
    curvature_out = found_curvature if curvature else None
    # one pair of directions at a time, each twice the model's size: the Hessian's (already there), then the random
    found = {"hess": _pair(loss, params, eig, settings, hvp, dtype)}
    del eig
    gen = torch.Generator().manual_seed(settings.seed)
    rand = (random_direction(params, gen), random_direction(params, gen))
    global_value, global_reason = global_range(loss, params, rand, settings)
    found["rand"] = _pair(loss, params, rand, settings, hvp, dtype)  # a large model's: used up
    del rand
    found_landscape = Values({}, {})
    for pair in ("rand", "hess"):  # the keys in the vocabulary's order
        summary, reason, _, _ = found[pair]
        found_landscape.values.update({f"{pair}_{k}": v for k, v in summary.items()})
        if reason:
            found_landscape.reasons.update({f"{pair}_{k}": reason for k in summary})
    found_landscape.values["rand_range_global"] = global_value
    if global_reason:
        found_landscape.reasons["rand_range_global"] = global_reason
    for pair in ("rand", "hess"):
        _, _, curv, reason = found[pair]
        found_landscape.values[f"{pair}_curv"] = curv
        if reason:
            found_landscape.reasons[f"{pair}_curv"] = reason
    return found_landscape, curvature_out


def _pair(loss, params: Params, directions: tuple[Params, Params] | str, settings: SurfaceSettings, hvp, dtype):
    """``(summary, reason, curvature, its reason)`` of the slice along ``directions`` (or the reason there are none);
    a NULL slice has no curvature either. A large model's (float32) directions are used up by the curvature."""
    if isinstance(directions, str):
        summary, reason = dict.fromkeys(SUMMARY_KEYS, np.nan), directions
    else:
        summary, reason = slice_values(loss, params, directions, settings)
    return (summary, reason, *slice_curvature(hvp, reason or directions, dtype, consume=dtype == np.float32))


def large_model(dim: int, settings: SurfaceSettings) -> bool:
    """Whether the curvature takes the large-model path: its Lanczos basis would not be kept in memory
    (``hessian_iters`` float64 vectors over ``curvature.BASIS_BYTES``). Every ladder rung stays below (its values
    are those of the float64 products); a Pythia-70M shape and up do not."""
    return spilled_vectors(dim, settings.iters, settings.top) > 0


def spilled_vectors(dim: int, iters: int, top: int) -> int:
    """How many float32 vectors of ``dim`` values the loss surface keeps in files at once: on a large model
    (:func:`large_model`), the ``max(top, 2)`` Ritz vectors, the current and previous Lanczos vectors and the
    trace's probe (the slices' two directions come later, alone); 0 on a model whose vectors stay in memory.
    ``iters`` / ``top``: ``features.hessian_iters`` / ``hessian_top``."""
    if keeps_basis(min(iters, dim), dim, BASIS_BYTES):
        return 0
    return max(top, 2) + 3


def curvature_products(
    loss: LossOfParams,
    params: Params,
    settings: SurfaceSettings,
    windows: Sequence[LossOfParams] = (),
    one_sided: bool = True,
):
    """``(hvp, dim, dtype)``: the Hessian-vector products the curvature runs on, and their vectors' dtype.

    One-sided (or central) differences of float64 gradients, one ordinary backward pass per product on the fused
    attention kernels, accurate to about 1e-7 relative, four orders below LANCZOS_TOL; on a large model
    (:func:`large_model`) exact float32 products of ``windows`` one at a time (``slice.exact_hvp``: no float64
    copy of the weights, one window's activations), about 3e-7 relative to the float64 ones."""
    if large_model(sum(p.numel() for p in params.values()), settings):
        hvp, dim = exact_hvp(tuple(windows) or (loss,), params)
        return hvp, dim, np.float32
    hvp, dim = difference_hvp(loss, params, one_sided)
    return hvp, dim, np.float64


def global_range(
    loss: LossOfParams, params: Params, directions: tuple[Params, Params], settings: SurfaceSettings
) -> tuple[float, str | None]:
    """``max - min`` loss (nats) of the :data:`GLOBAL_GRID` x :data:`GLOBAL_GRID` slice of half-width
    :data:`GLOBAL_RADIUS` along ``directions``, or NaN and why (a non-finite loss on it)."""
    on_gpu = next(iter(params.values())).is_cuda
    chunk = settings.chunk or (grid_chunk(params, GLOBAL_GRID) if on_gpu else 1)
    grid = loss_grid(loss, params, *directions, GLOBAL_RADIUS, GLOBAL_GRID, chunk)
    bad = int((~np.isfinite(grid)).sum())
    if bad:
        return np.nan, f"non-finite loss at {bad} of {grid.size} slice points"
    return float(grid.max() - grid.min()), None


def slice_curvature(
    hvp, directions: tuple[Params, Params] | str, dtype: type = np.float64, consume: bool = False
) -> tuple[float, str | None]:
    """``(d1^T H d1 + d2^T H d2) / 2`` (nats per squared filter-normalised unit): the slice's mean second
    derivative along its two axes at the centre, or NaN and why (``directions`` is the reason: no directions, a
    NULL slice; a non-finite product).

    The directions are the slice's own, unscaled, so this is the curvature the slice's grid shows at the
    weights (its second differences tend to it, tests); ``d^T H d / ||d||^2`` would be a Rayleigh quotient
    instead, comparable with the eigenvalues but not with the slice. ``dtype``: the products' vectors'.
    ``consume`` (a large model's float32 products, which read a vector from a file, ``slice.exact_hvp``): each
    direction is written to an unnamed file a tensor at a time, leaving its dict as it goes (the
    directions are used up), before the first product; each product reads its direction from the file and the
    dot product reads it again a chunk at a time, so no direction is in memory through a product (the 410M
    shape's loss surface peaked at 8,651 MiB with both directions in memory, 7,775 with one)."""
    if isinstance(directions, str):
        return np.nan, directions
    with contextlib.ExitStack() as files:
        try:
            if consume:  # every direction written out before the first product
                directions = [_written(d, files) for d in directions]
            values = []
            for d in directions:
                vector = d if isinstance(d, FileRows) else _flattened(d, dtype)
                values.append(dot(vector, np.asarray(hvp(vector), dtype=dtype)))
                del vector
        except (FloatingPointError, NoRoom) as err:  # a non-finite product, a full disk: the reason
            return np.nan, str(err)
    return float(np.mean(values)), None


def curvature_values(
    loss: LossOfParams,
    params: Params,
    settings: SurfaceSettings,
    one_sided: bool = True,
    stop_early: bool = True,
    windows: Sequence[LossOfParams] = (),
) -> tuple[Values, tuple[Params, Params] | str]:
    """Curvature :data:`CURVATURE_KEYS`, and the filter-normalised top-2 eigenvectors (or why there are none).

    ``one_sided`` / ``stop_early`` False: central differences and all ``hessian_iters`` steps (the reference
    ``python tools/surface_stability.py`` compares the defaults with; a large model's products are exact either
    way). ``windows``: as in :func:`surface_values`."""
    hvp, dim, dtype = curvature_products(loss, params, settings, windows, one_sided)
    return _curvature_values(_finite(hvp), dim, params, settings, stop_early, dtype)


def _curvature_values(
    hvp,
    dim: int,
    params: Params,
    settings: SurfaceSettings,
    stop_early: bool = True,
    dtype: type = np.float64,
    trace: bool = True,
):
    """``hvp`` raises FloatingPointError on a non-finite product (:func:`_finite`). Float32 vectors (a large
    model): the Ritz vectors are summed in an unnamed file, closed before this returns (a full disk: every value
    NULL with the one line of :class:`~topometrics.landscape.vectors.NoRoom`). ``trace`` False:
    the trace is not estimated (NaN, as its ratio), for a caller that needs only the top eigenpairs."""
    large = dtype == np.float32
    with contextlib.ExitStack() as files:
        spill = files if large else None
        try:
            k = max(settings.top, 2)
            eig = top_eigenpairs(
                hvp, dim, k, settings.iters, settings.seed, LANCZOS_TOL, stop_early,
                basis_bytes=0 if large else BASIS_BYTES, dtype=dtype, spill=spill,
            )  # fmt: skip
            estimate, stderr = np.nan, np.nan
            if trace:
                probes = Probes(settings.probes, settings.trace_rse, settings.probes_max)
                found = hessian_trace(hvp, dim, settings.exact_max, probes, settings.seed, eig.vectors, dtype)
                estimate, stderr = found.trace, found.stderr
        except (FloatingPointError, NoRoom) as err:
            reason = str(err)
            return Values(dict.fromkeys(CURVATURE_KEYS, np.nan), dict.fromkeys(CURVATURE_KEYS, reason)), reason
        return _eigen_values(eig, estimate, stderr, params, settings)


def _eigen_values(eig, trace: float, stderr: float, params: Params, settings: SurfaceSettings):
    """The curvature's values and reasons, and the top-2 filter-normalised eigenvectors (or why there are none)."""
    values = {key: float(eig.values[i]) if i < settings.top else np.nan for i, key in enumerate(EIGEN_KEYS)}
    values |= {"trace": trace, "eig1_over_trace": float(eig.values[0]) / trace if trace != 0 else np.nan}
    values["trace_se"] = stderr
    reasons = {}
    for i, key in enumerate(EIGEN_KEYS):
        if i >= settings.top:
            reasons[key] = f"features.hessian_top = {settings.top} keeps fewer eigenvalues"
        elif not eig.converged[i]:
            reasons[key] = f"Lanczos did not converge in {settings.iters} steps (features.hessian_iters)"
    if "eig1" in reasons:
        reasons["eig1_over_trace"] = reasons["eig1"]
    elif trace == 0:
        reasons["eig1_over_trace"] = "Hessian trace estimate is 0"
    if not eig.converged[:2].all():
        why = f"Lanczos did not converge in {settings.iters} steps (features.hessian_iters): no top-2 eigenvectors"
        return Values(values, reasons), why
    vectors = tuple(filter_normalised(unflatten(eig.vector(i), params), params) for i in range(2))
    return Values(values, reasons), vectors


def slice_values(
    loss: LossOfParams, params: Params, directions: tuple[Params, Params], settings: SurfaceSettings
) -> tuple[dict[str, float], str | None]:
    """The slice summary along ``directions``, or NaNs and the reason when the slice has a non-finite loss."""
    on_gpu = next(iter(params.values())).is_cuda
    chunk = settings.chunk or (grid_chunk(params, settings.grid) if on_gpu else 1)
    grid = loss_grid(loss, params, *directions, settings.radius, settings.grid, chunk)
    bad = int((~np.isfinite(grid)).sum())
    if bad:
        return dict.fromkeys(SUMMARY_KEYS, np.nan), f"non-finite loss at {bad} of {grid.size} slice points"
    return slice_summary(grid), None


def grid_chunk(params: Params, grid: int) -> int:
    """Grid points per vmapped forward pass: all ``grid**2`` if their stacked parameters fit GRID_PARAMETERS."""
    size = sum(p.numel() for p in params.values())
    return max(1, min(grid * grid, GRID_PARAMETERS // max(size, 1)))


def _flattened(direction: Params, dtype: type) -> np.ndarray:
    """``direction`` as one flat array in its order."""
    flat, at = np.empty(sum(t.numel() for t in direction.values()), dtype=dtype), 0
    for t in direction.values():
        part = t.detach().reshape(-1).cpu().numpy()
        flat[at : at + part.size] = part
        at += part.size
    return flat


def _written(direction: Params, files: contextlib.ExitStack) -> FileRows:
    """``direction`` flattened (float32, its order) into a one-row unnamed file ``files`` closes, a tensor at a
    time, each tensor leaving the dict as it is written (used up: the direction is never whole in memory twice)."""
    rows, at = file_rows(files, 1, sum(t.numel() for t in direction.values())), 0
    for key in list(direction):
        part = direction.pop(key).detach().reshape(-1).cpu().numpy()
        write_part(rows, 0, at, part)
        at += part.size
    return rows


def _finite(hvp):
    def checked(v: np.ndarray) -> np.ndarray:
        out = hvp(v)
        if not all_finite(out):
            raise FloatingPointError("non-finite Hessian-vector product")
        return out

    return checked
