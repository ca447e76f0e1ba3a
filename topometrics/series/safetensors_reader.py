"""Single tensors of a safetensors file, read with plain reads at the offsets of its header.

``safetensors.safe_open`` validates each file first (a truncated or corrupt file raises
:class:`CheckpointError` naming it); it is not used to read, because it keeps the whole file
mapped and resident pages then count towards the process's memory (3.3 GB for a
Pythia-1B-shaped file, measured). Reading one tensor at a time keeps peak memory at about the
largest tensor.

The header's sizes are a stranger's word: ``safe_open`` holds them to the file's length, and
:meth:`SafetensorsFile.size_problem` to what is stored and to the memory free, before any tensor is
read (a 4 KB sparse file can claim an 8 GB tensor and be as long as its header says).
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open

from topometrics.models.checkpoints import CheckpointError
from topometrics.training.memory import available_ram_bytes

_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16}
_CHUNK_BYTES = 1 << 20  # pass-1 read size: the read and abs/max touch the same cache-resident bytes
_MAX_READ = 1 << 30  # bytes per read call (Linux returns at most ~2 GiB per read)
# A file with less than this share of its length stored on disk is mostly holes (sparse: never written).
# Real weights are stored whole; even a compressing filesystem keeps most of random floats' bytes.
MIN_STORED_SHARE = 1 / 8
_SPARSE_MIN_BYTES = 1 << 24  # below 16 MiB block rounding and tiny files make the share meaningless
READ_COPIES = 2  # a tensor read as float32 is held with one working copy of its size (bench series: < 2x)


class SafetensorsFile:
    """Single tensors of a safetensors file, read with plain reads (the file is never kept mapped).

    Parameters
    ----------
    path : Path
        The file. It is validated with ``safetensors.safe_open`` first; a truncated or corrupt file
        raises :class:`CheckpointError` whose message starts with the path.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():  # a FIFO would block the open below forever
            raise CheckpointError(f"{self.path}: not a regular file (a FIFO, socket or device, or missing); never read")
        try:
            with safe_open(str(self.path), framework="numpy"):  # checks the header and the file length
                pass
            with open(self.path, "rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(size))
        except (SafetensorError, OSError, ValueError) as err:
            raise CheckpointError(f"{self.path}: not a readable safetensors file ({err}); re-download it") from err
        header.pop("__metadata__", None)
        self.header = header
        self.data_start = 8 + size

    @property
    def names(self) -> list[str]:
        return list(self.header)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.header[name]["shape"])

    def size_problem(self) -> str | None:
        """``<file>: <why>`` when the file's tensors cannot be read safely, else None; reads no tensor.

        A tensor whose float32 copies (:data:`READ_COPIES`) exceed the memory free now would take the
        stage down; a file mostly of holes (less than :data:`MIN_STORED_SHARE` of its length stored on
        disk) holds sizes nobody wrote. Either way the checkpoint is skipped, before anything is allocated.
        """
        free = available_ram_bytes()
        for name in self.names:
            need = READ_COPIES * 4 * math.prod(self.shape(name))
            if free is not None and need > free:
                return (f"{self.path}: tensor {name} {list(self.shape(name))} needs {need / 2**30:.1f} GiB to read as "
                        f"float32, more than the {free / 2**30:.1f} GiB free")  # fmt: skip
        info = self.path.stat()
        stored = getattr(info, "st_blocks", None)
        if stored is not None and info.st_size >= _SPARSE_MIN_BYTES and stored * 512 < MIN_STORED_SHARE * info.st_size:
            return (f"{self.path}: {info.st_size:,} bytes long but only {stored * 512:,} stored (a sparse file: its "
                    "tensors were never written); not a checkpoint, re-download or re-save it")  # fmt: skip
        return None

    def _entry(self, name: str) -> tuple[np.dtype, tuple[int, ...], int, int]:
        entry = self.header[name]
        if entry["dtype"] not in _DTYPES:
            raise CheckpointError(f"{self.path}: tensor {name} has dtype {entry['dtype']}; expected a float type")
        start, stop = entry["data_offsets"]
        return np.dtype(_DTYPES[entry["dtype"]]), tuple(entry["shape"]), self.data_start + start, stop - start

    def absmax(self, name: str) -> float:
        """``max |w|`` of one tensor in ~1 MiB chunks (NaN if any entry is NaN, inf if any is inf)."""
        dtype, _, offset, nbytes = self._entry(name)
        buf = np.empty(_CHUNK_BYTES, dtype=np.uint8)
        best = np.float64(0.0)
        with open(self.path, "rb", buffering=0) as f:
            f.seek(offset)
            for done in range(0, nbytes, _CHUNK_BYTES):
                raw = buf[: _read_into(f, buf[: min(_CHUNK_BYTES, nbytes - done)], self.path)]
                chunk = _as_float(raw.view(dtype), self.header[name]["dtype"])
                best = np.maximum(best, np.abs(chunk).max(initial=0.0))  # np.maximum propagates NaN
        return float(best)

    def read(self, name: str) -> np.ndarray:
        """One tensor as a float32 array of its stored shape (bf16/fp16/fp64 converted)."""
        dtype, shape, offset, nbytes = self._entry(name)
        raw = np.empty(nbytes, dtype=np.uint8)
        with open(self.path, "rb", buffering=0) as f:
            f.seek(offset)
            _read_into(f, raw, self.path)
        return _as_float(raw.view(dtype), self.header[name]["dtype"]).astype(np.float32, copy=False).reshape(shape)


def _read_into(f, out: np.ndarray, path: Path) -> int:
    view, done = memoryview(out), 0
    while done < out.size:
        got = f.readinto(view[done : done + _MAX_READ])
        if not got:
            raise CheckpointError(f"{path}: file ends inside a tensor (truncated); re-download it")
        done += got
    return done


def _as_float(values: np.ndarray, dtype_name: str) -> np.ndarray:
    if dtype_name == "BF16":  # bfloat16 is the top half of a float32
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values
