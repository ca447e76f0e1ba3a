"""Parameter-sized vectors of a model too large for float64 copies: float32 arithmetic and rows kept in a file.

A Pythia-410M-shaped model's parameter vector is 1.2 GB in float32 and 2.4 GB in float64; the curvature's
Lanczos run needs three such vectors and its ``k`` Ritz vectors besides the model. These helpers let it keep
only float32 vectors and no temporary of a vector's size:

- :func:`dot` accumulates in float64 over chunks of :data:`CHUNK` values (one float32 BLAS dot a chunk: its
  rounding stays that of a short sum, ~1e-7 relative, where one float32 dot of 3e8 values would lose ~1e-4);
  :func:`axpy` is BLAS's in-place ``y += a x`` in the vectors' precision. Float64 vectors take one BLAS call
  (the curvature's float64 path is unchanged by these helpers); float32 ones a call a chunk. Either takes
  for its first vector one kept in a file (:data:`Vector`: a one-row :class:`FileRows`), read a chunk at a
  time (:func:`parts`), with the same chunks and so the same rounding as in memory.
- :class:`FileRows`: ``rows`` float32 vectors of length ``dim`` in one file (row-major), read and written
  :data:`CHUNK` values at a time, so the process holds a chunk, not the rows (the page cache holds the rest,
  and the kernel may write it out instead of killing the process). :func:`add_rows` sums vectors into them,
  :func:`orthonormalise` makes them orthonormal in place (Cholesky QR: ``G = R R^T``, ``Q = L^-1 R`` with
  ``G = L L^T``, two passes; exact in exact arithmetic and accurate to ``cond(R)^2 eps`` otherwise, 1 for the
  nearly orthonormal Ritz vectors it serves), :func:`project_out` applies ``I - Q^T Q`` to a vector;
  :func:`read_part` and :func:`write_part` serve a parameter's share of a row.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np
from scipy.linalg.blas import daxpy, saxpy

CHUNK = 1 << 22  # values per chunk: 16 MB of float32


class FileRows(NamedTuple):
    """``rows`` float32 vectors of length ``dim``, row-major in the file ``path``."""

    path: str
    rows: int
    dim: int


# A vector in memory, or one kept in a file (a one-row :class:`FileRows`) and read a chunk at a time.
Vector = np.ndarray | FileRows


def dot(a: Vector, b: np.ndarray) -> float:
    """``a . b`` of two vectors, float64-accumulated over chunks when they are float32 (``a`` in a file: float32,
    read a chunk at a time)."""
    if isinstance(a, FileRows):
        return float(sum(float(np.dot(part, b[i : i + len(part)])) for i, part in parts(a)))
    if a.dtype == np.float64 and b.dtype == np.float64:
        return float(a @ b)
    return float(sum(float(np.dot(a[i : i + CHUNK], b[i : i + CHUNK])) for i in range(0, len(a), CHUNK)))


def norm(a: np.ndarray) -> float:
    return float(np.sqrt(dot(a, a)))


def axpy(x: Vector, y: np.ndarray, a: float) -> np.ndarray:
    """``y + a x``, in place in ``y`` (both float32 or both float64, contiguous; ``x`` in a file: ``y`` float32,
    ``x`` read a chunk at a time); returns ``y``."""
    if y.dtype == np.float64:
        return daxpy(x, y, a=a)
    # float32: a chunk at a time whether ``x`` is in memory or in a file, so both round alike (BLAS's vector
    # body and its tail round differently: one call over the whole and calls over chunks differ in the last bit)
    chunks = parts(x) if isinstance(x, FileRows) else ((i, x[i : i + CHUNK]) for i in range(0, len(x), CHUNK))
    for i, part in chunks:
        y[i : i + len(part)] = saxpy(part, y[i : i + len(part)], a=a)
    return y


def parts(vector: FileRows):
    """``(start, values)`` of each float32 chunk of a one-row file, read in turn (one chunk held at a time)."""
    with open(vector.path, "rb") as f:
        for start, stop in _chunks(vector):
            yield start, _read(f, vector, 0, start, stop)


def read_part(rows: FileRows, i: int, start: int, stop: int) -> np.ndarray:
    """Values ``start:stop`` of row ``i``, float32 (a parameter's share of a vector, read as a product needs it)."""
    with open(rows.path, "rb") as f:
        return _read(f, rows, i, start, stop)


def write_part(rows: FileRows, i: int, start: int, values: np.ndarray) -> None:
    """Values ``start:start + len(values)`` of row ``i`` := ``values`` (float32)."""
    with open(rows.path, "r+b") as f:
        for at in range(0, len(values), CHUNK):
            _write(f, rows, i, start + at, values[at : at + CHUNK])


def file_rows(folder: str, name: str, rows: int, dim: int) -> FileRows:
    """Zeroed rows in a new file ``folder/name`` (sparse: the zeros take no disk until written)."""
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.truncate(rows * dim * 4)
    return FileRows(path, rows, dim)


def _chunks(rows: FileRows, share: int = 1):
    """``(start, stop)`` of each chunk of a row: :data:`CHUNK` values, or ``1/share`` of that when ``share`` rows'
    chunks are held at once in float64."""
    size = max(1, CHUNK // share)
    for start in range(0, rows.dim, size):
        yield start, min(start + size, rows.dim)


def _read(f, rows: FileRows, i: int, start: int, stop: int) -> np.ndarray:
    f.seek((i * rows.dim + start) * 4)
    return np.fromfile(f, dtype=np.float32, count=stop - start)


def _write(f, rows: FileRows, i: int, start: int, values: np.ndarray) -> None:
    f.seek((i * rows.dim + start) * 4)
    np.ascontiguousarray(values, dtype=np.float32).tofile(f)


def add_rows(rows: FileRows, coefficients: np.ndarray, vector: Vector) -> None:
    """Row ``i`` += ``coefficients[i] * vector`` (float32 arithmetic, as an in-memory float32 sum would do)."""
    with open(rows.path, "r+b") as f:
        for start, stop in _chunks(rows):
            if isinstance(vector, FileRows):
                part = read_part(vector, 0, start, stop)
            else:
                part = vector[start:stop].astype(np.float32, copy=False)
            for i in range(rows.rows):
                _write(f, rows, i, start, _read(f, rows, i, start, stop) + np.float32(coefficients[i]) * part)


def write_row(rows: FileRows, i: int, vector: np.ndarray) -> FileRows:
    """Row ``i`` := ``vector`` (float32); returns ``rows``, to be passed on in the vector's stead."""
    with open(rows.path, "r+b") as f:
        for start, stop in _chunks(rows):
            _write(f, rows, i, start, vector[start:stop])
    return rows


def all_finite(vector: np.ndarray) -> bool:
    """Whether every value is finite, checked a chunk at a time (no boolean array of the vector's size)."""
    return all(bool(np.isfinite(vector[i : i + CHUNK]).all()) for i in range(0, len(vector), CHUNK))


def read_row(rows: FileRows, i: int) -> np.ndarray:
    """Row ``i`` as a float32 ``(dim,)`` array (one vector in memory)."""
    with open(rows.path, "rb") as f:
        f.seek(i * rows.dim * 4)
        return np.fromfile(f, dtype=np.float32, count=rows.dim)


def _block(f, rows: FileRows, start: int, stop: int) -> np.ndarray:
    """Every row's values ``start:stop``, ``(rows, stop - start)`` float64."""
    return np.stack([_read(f, rows, i, start, stop) for i in range(rows.rows)]).astype(np.float64)


def gram(rows: FileRows) -> np.ndarray:
    """``R R^T`` ``(rows, rows)`` float64, accumulated over chunks."""
    out = np.zeros((rows.rows, rows.rows))
    with open(rows.path, "rb") as f:
        for start, stop in _chunks(rows, 2 * rows.rows):
            block = _block(f, rows, start, stop)
            out += block @ block.T
    return out


def scale_rows(rows: FileRows, transform: np.ndarray) -> None:
    """Rows replaced by ``transform @ rows`` (``(rows, rows)``), a chunk at a time."""
    with open(rows.path, "r+b") as f:
        for start, stop in _chunks(rows, 4 * rows.rows):
            for i, values in enumerate(transform @ _block(f, rows, start, stop)):
                _write(f, rows, i, start, values)


def orthonormalise(rows: FileRows) -> None:
    """The rows made orthonormal in place, spanning the same space (Cholesky QR; see the module docstring)."""
    lower = np.linalg.cholesky(gram(rows))
    scale_rows(rows, np.linalg.inv(lower))


def project_out(rows: FileRows, vector: np.ndarray) -> np.ndarray:
    """``vector - Q^T (Q vector)`` in place for orthonormal rows ``Q``; returns ``vector``."""
    with open(rows.path, "rb") as f:
        coefficients = np.zeros(rows.rows)
        for start, stop in _chunks(rows):
            for i in range(rows.rows):
                coefficients[i] += float(np.dot(_read(f, rows, i, start, stop), vector[start:stop]))
        for start, stop in _chunks(rows):
            for i in range(rows.rows):
                vector[start:stop] -= (coefficients[i] * _read(f, rows, i, start, stop)).astype(vector.dtype)
    return vector
