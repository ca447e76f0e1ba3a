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
- :class:`FileRows`: ``rows`` float32 vectors of length ``dim`` in one file (row-major) that has no name
  (:func:`file_rows`: a process killed mid-run leaves no file behind), on disk (:func:`scratch_folder`), read
  and written :data:`CHUNK` values at a time, so the process holds a chunk, not the rows (the page cache holds the rest,
  and the kernel may write it out instead of killing the process). :func:`add_rows` sums vectors into them,
  :func:`orthonormalise` makes them orthonormal in place (Cholesky QR: ``G = R R^T``, ``Q = L^-1 R`` with
  ``G = L L^T``, two passes; exact in exact arithmetic and accurate to ``cond(R)^2 eps`` otherwise, 1 for the
  nearly orthonormal Ritz vectors it serves), :func:`project_out` applies ``I - Q^T Q`` to a vector;
  :func:`read_part` and :func:`write_part` serve a parameter's share of a row.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from typing import NamedTuple

import numpy as np
from scipy.linalg.blas import daxpy, saxpy

CHUNK = 1 << 22  # values per chunk: 16 MB of float32


class FileRows(NamedTuple):
    """``rows`` float32 vectors of length ``dim``, row-major in the unnamed file open as descriptor ``fd``."""

    fd: int
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
    for start, stop in _chunks(vector):
        yield start, read_part(vector, 0, start, stop)


def write_part(rows: FileRows, i: int, start: int, values: np.ndarray) -> None:
    """Values ``start:start + len(values)`` of row ``i`` := ``values`` (float32)."""
    for at in range(0, len(values), CHUNK):
        _write(rows, i, start + at, values[at : at + CHUNK])


def file_rows(scratch: contextlib.ExitStack, rows: int, dim: int) -> FileRows:
    """Zeroed rows in a new unnamed file (sparse: the zeros take no disk until written), in
    :func:`scratch_folder`. It has no name from the start, so nothing can be left behind: ``scratch``'s close
    closes it, and the kernel frees its disk when the process ends however it ends (a kill -9 included)."""
    f = scratch.enter_context(tempfile.TemporaryFile(dir=scratch_folder()))  # noqa: SIM115 (the stack closes it)
    f.truncate(rows * dim * 4)
    return FileRows(f.fileno(), rows, dim)


def scratch_folder(mountinfo: str = "/proc/self/mountinfo") -> str:
    """Where the unnamed files go: the temporary folder (``TMPDIR``, else ``/tmp``), unless it is a memory
    filesystem (a tmpfs, as Debian 13's ``/tmp`` is) and ``/var/tmp`` is not: a file in memory would hold in RAM
    the vectors it exists to keep out of it."""
    folder = tempfile.gettempdir()
    try:
        with open(mountinfo) as f:
            table = f.read()
    except OSError:  # not Linux: no way to ask, keep the temporary folder
        return folder
    if in_memory(folder, table) and os.path.isdir("/var/tmp") and not in_memory("/var/tmp", table):
        return "/var/tmp"
    return folder


def scratch_space() -> tuple[str, int]:
    """:func:`scratch_folder` and the bytes free on its disk now."""
    folder = scratch_folder()
    return folder, shutil.disk_usage(folder).free


def in_memory(folder: str, mountinfo: str) -> bool:
    """Whether ``folder`` lies on a memory filesystem (tmpfs, ramfs) by the mount table ``mountinfo`` (the text of
    ``/proc/self/mountinfo``: field 5 the mount point, the filesystem type after the `` - `` separator)."""
    folder, kind, deepest = os.path.realpath(folder), None, -1
    for line in mountinfo.splitlines():
        fields, _, tail = line.partition(" - ")
        fields = fields.split()
        if len(fields) < 5 or not tail:
            continue
        point = fields[4].replace("\\040", " ")
        inside = folder == point or folder.startswith(point.rstrip("/") + "/")
        if inside and len(point) > deepest:
            kind, deepest = tail.split()[0], len(point)
    return kind in ("tmpfs", "ramfs")


def _chunks(rows: FileRows, share: int = 1):
    """``(start, stop)`` of each chunk of a row: :data:`CHUNK` values, or ``1/share`` of that when ``share`` rows'
    chunks are held at once in float64."""
    size = max(1, CHUNK // share)
    for start in range(0, rows.dim, size):
        yield start, min(start + size, rows.dim)


def read_part(rows: FileRows, i: int, start: int, stop: int) -> np.ndarray:
    """Values ``start:stop`` of row ``i``, float32 (a parameter's share of a vector, read as a product needs it;
    positioned reads: no file offset shared between callers). ``stop`` past the row's end reads to its end, as
    a slice would."""
    stop = min(stop, rows.dim)
    out = np.empty(stop - start, dtype=np.float32)
    view, at = memoryview(out).cast("B"), (i * rows.dim + start) * 4
    while view.nbytes:
        done = os.preadv(rows.fd, [view], at)
        if done == 0:
            raise EOFError(f"the vectors' file ends at byte {at}: {rows.rows} x {rows.dim} float32 expected")
        view, at = view[done:], at + done
    return out


class NoRoom(OSError):
    """The disk of the vectors' files is full; the message is one line: which folder, what it was writing, the fix."""


def _write(rows: FileRows, i: int, start: int, values: np.ndarray) -> None:
    view = memoryview(np.ascontiguousarray(values, dtype=np.float32)).cast("B")
    at = (i * rows.dim + start) * 4
    while view.nbytes:
        try:
            done = os.pwritev(rows.fd, [view], at)
        except OSError as err:
            if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            size = rows.rows * rows.dim * 4 / 2**30
            raise NoRoom(
                f"no room left in {scratch_folder()} for a file of {size:.2f} GB of the loss surface's "
                "vectors; point TMPDIR at a disk with room (docs/performance.md)"
            ) from err
        view, at = view[done:], at + done


def add_rows(rows: FileRows, coefficients: np.ndarray, vector: Vector) -> None:
    """Row ``i`` += ``coefficients[i] * vector`` (float32 arithmetic, as an in-memory float32 sum would do)."""
    for start, stop in _chunks(rows):
        if isinstance(vector, FileRows):
            part = read_part(vector, 0, start, stop)
        else:
            part = vector[start:stop].astype(np.float32, copy=False)
        for i in range(rows.rows):
            _write(rows, i, start, read_part(rows, i, start, stop) + np.float32(coefficients[i]) * part)


def write_row(rows: FileRows, i: int, vector: np.ndarray) -> FileRows:
    """Row ``i`` := ``vector`` (float32); returns ``rows``, to be passed on in the vector's stead."""
    for start, stop in _chunks(rows):
        _write(rows, i, start, vector[start:stop])
    return rows


def all_finite(vector: np.ndarray) -> bool:
    """Whether every value is finite, checked a chunk at a time (no boolean array of the vector's size)."""
    return all(bool(np.isfinite(vector[i : i + CHUNK]).all()) for i in range(0, len(vector), CHUNK))


def read_row(rows: FileRows, i: int) -> np.ndarray:
    """Row ``i`` as a float32 ``(dim,)`` array (one vector in memory)."""
    return read_part(rows, i, 0, rows.dim)


def _block(rows: FileRows, start: int, stop: int) -> np.ndarray:
    """Every row's values ``start:stop``, ``(rows, stop - start)`` float64."""
    return np.stack([read_part(rows, i, start, stop) for i in range(rows.rows)]).astype(np.float64)


def gram(rows: FileRows) -> np.ndarray:
    """``R R^T`` ``(rows, rows)`` float64, accumulated over chunks."""
    out = np.zeros((rows.rows, rows.rows))
    for start, stop in _chunks(rows, 2 * rows.rows):
        block = _block(rows, start, stop)
        out += block @ block.T
    return out


def scale_rows(rows: FileRows, transform: np.ndarray) -> None:
    """Rows replaced by ``transform @ rows`` (``(rows, rows)``), a chunk at a time."""
    for start, stop in _chunks(rows, 4 * rows.rows):
        for i, values in enumerate(transform @ _block(rows, start, stop)):
            _write(rows, i, start, values)


def orthonormalise(rows: FileRows) -> None:
    """The rows made orthonormal in place, spanning the same space (Cholesky QR; see the module docstring)."""
    lower = np.linalg.cholesky(gram(rows))
    scale_rows(rows, np.linalg.inv(lower))


def project_out(rows: FileRows, vector: np.ndarray) -> np.ndarray:
    """``vector - Q^T (Q vector)`` in place for orthonormal rows ``Q``; returns ``vector``."""
    coefficients = np.zeros(rows.rows)
    for start, stop in _chunks(rows):
        for i in range(rows.rows):
            coefficients[i] += float(np.dot(read_part(rows, i, start, stop), vector[start:stop]))
    for start, stop in _chunks(rows):
        for i in range(rows.rows):
            vector[start:stop] -= (coefficients[i] * read_part(rows, i, start, stop)).astype(vector.dtype)
    return vector
