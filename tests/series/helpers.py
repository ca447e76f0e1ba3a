"""Helpers shared by the series tests: a safetensors file that declares tensors but stores few bytes."""

import json

import numpy as np


def sparse_safetensors(path, shape: tuple[int, ...], stored: int = 4096) -> None:
    """A safetensors file whose header claims one float32 tensor of ``shape``, as long as the header says,
    of which only ``stored`` bytes are written (the rest a hole: a sparse file)."""
    size = 4 * int(np.prod(shape))
    header = json.dumps({"w": {"dtype": "F32", "shape": list(shape), "data_offsets": [0, size]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header + b"\x01" * stored)
        f.truncate(8 + len(header) + size)
