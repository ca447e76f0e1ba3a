"""Tests of topometrics.measures.row_blocks: blocks cover every row once, in order, within the byte budget."""

import numpy as np
import pytest

from topometrics.measures import row_blocks
from topometrics.measures.row_blocks import BLOCK_BYTES, float64_row_blocks, row_block_bounds


@pytest.mark.parametrize(("n_rows", "row_bytes"), [(0, 8), (1, 8), (1000, 8 * 512), (7, 10 * BLOCK_BYTES), (5, 0)])
def test_blocks_cover_every_row_once_in_order_within_the_budget(n_rows, row_bytes):
    bounds = row_block_bounds(n_rows, row_bytes)
    assert [i for start, stop in bounds for i in range(start, stop)] == list(range(n_rows))
    sizes = [stop - start for start, stop in bounds]
    assert all(size >= 1 and (size * row_bytes <= BLOCK_BYTES or size == 1) for size in sizes)


def test_float64_row_blocks_are_the_rows_converted(monkeypatch):
    monkeypatch.setattr(row_blocks, "BLOCK_BYTES", 3 * 8 * 5)  # three rows of five float64 per block
    m = np.arange(40, dtype=np.float32).reshape(8, 5)
    blocks = list(float64_row_blocks(m))
    assert [start for start, _ in blocks] == [0, 3, 6] and all(b.dtype == np.float64 for _, b in blocks)
    np.testing.assert_array_equal(np.concatenate([b for _, b in blocks]), m.astype(np.float64))
