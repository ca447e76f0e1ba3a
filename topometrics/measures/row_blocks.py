"""Cache-sized blocks of a matrix's rows: how a layer is worked on a piece at a time.

Neural persistence's ``|W|`` passes, the Gram matrix of the singular values and the scale-free
row passes each hold one block of :data:`BLOCK_BYTES` besides the layer, never a full-size copy
of it (a streaming worker's peak memory, docs/scaling.md), and the block stays in cache while
it is read more than once.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

BLOCK_BYTES = 1 << 19  # 512 KB


def row_block_bounds(n_rows: int, row_bytes: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of consecutive blocks of ``n_rows`` rows of ``row_bytes`` bytes each,
    :data:`BLOCK_BYTES` per block (at least one row)."""
    step = max(1, BLOCK_BYTES // max(1, row_bytes))
    return [(start, min(start + step, n_rows)) for start in range(0, n_rows, step)]


def float64_row_blocks(matrix: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """``(start, rows start..stop as a new float64 array)`` over the blocks of an ``(n, m)`` matrix."""
    for start, stop in row_block_bounds(matrix.shape[0], 8 * matrix.shape[1]):
        yield start, np.asarray(matrix[start:stop], dtype=np.float64)
