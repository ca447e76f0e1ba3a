"""Atomic file writes: write a temporary file beside the target, then rename it over the target.

A rename within one directory is atomic (``os.replace``), so a reader sees the old file or the
new one, never half of one, and a killed writer leaves the previous file intact (a write that finds
its disk full too: it raises :class:`topometrics.errors.DiskFullError` naming the file). Every file the
project writes goes through :func:`replacing` (the DuckDB warehouse and the Parquet shards with their
own temporary names, safetensors in ``topometrics.models.checkpoints.save_tensors``; everything else through the
``write_*`` functions here).

:func:`file_sha256` is the content hash that verifies such a file later (a checkpoint against its
sidecar, a token file against ``source.json``): a rename proves a file whole when written, not
unchanged since.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from topometrics.errors import NO_SPACE, disk_full

if TYPE_CHECKING:  # annotations only: writing text needs neither numpy nor pandas loaded
    import numpy as np
    import pandas as pd


@contextmanager
def replacing(path: Path, tmp: Path | None = None) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces ``path``, on an exception it is removed.

    ``tmp`` defaults to ``<path>.tmp`` in the same directory (same filesystem, so the rename is
    atomic); a writer killed mid-way leaves it behind, and the next write to ``path`` overwrites it.
    """
    path = Path(path)
    tmp = Path(tmp) if tmp is not None else path.with_name(path.name + ".tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as err:
        if err.errno in NO_SPACE:  # one line naming the file, not errno 28's traceback
            raise disk_full(path) from err
        raise
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with replacing(path) as tmp:
        tmp.write_text(text)


def write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with replacing(path) as tmp:
        tmp.write_bytes(data)


def write_parquet(path: Path, frame: pd.DataFrame) -> None:
    """Write a DataFrame as Parquet (no index) to ``path`` atomically."""
    with replacing(path) as tmp:
        frame.to_parquet(tmp, index=False)


def write_array(path: Path, array: np.ndarray) -> None:
    """Write an array's raw bytes (``ndarray.tofile``) to ``path`` atomically."""
    with replacing(path) as tmp:
        array.tofile(tmp)


def file_sha256(*paths: Path) -> str:
    """sha256 (hex) of the files' bytes, in order (read in 1 MiB blocks)."""
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()
