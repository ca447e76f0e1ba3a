"""topometrics.landscape.vectors: float32 dots against float64 ones, in-place axpy, and rows in a file against
the same arithmetic in memory (sums bit for bit, the Gram matrix, Cholesky QR's orthonormality and span, the
projection), holding a chunk of a row, not the rows."""

import tracemalloc

import numpy as np
import pytest

from topometrics.landscape import vectors
from topometrics.landscape.vectors import (
    FileRows,
    add_rows,
    axpy,
    dot,
    file_rows,
    gram,
    norm,
    orthonormalise,
    project_out,
    read_part,
    read_row,
    write_part,
    write_row,
)


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(vectors, "CHUNK", 1000)  # several chunks, and a short last one, on small vectors


def test_a_float32_dot_is_the_float64_dot_to_float32_rounding_and_float64_is_one_blas_call(small_chunks):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(10_500), rng.standard_normal(10_500)
    assert dot(a, b) == float(a @ b)
    exact = float(a.astype(np.float32).astype(np.float64) @ b.astype(np.float32).astype(np.float64))
    assert dot(a.astype(np.float32), b.astype(np.float32)) == pytest.approx(exact, rel=1e-6)
    assert norm(a) == pytest.approx(np.linalg.norm(a), rel=1e-15)


def test_axpy_updates_in_place_in_the_vectors_precision():
    x, y = np.arange(4, dtype=np.float32), np.ones(4, dtype=np.float32)
    out = axpy(x, y, 2.0)
    assert out.dtype == np.float32 and np.array_equal(out, [1, 3, 5, 7]) and np.shares_memory(out, y)
    assert np.array_equal(axpy(x.astype(np.float64), np.ones(4), -1.0), [1, 0, -1, -2])


def test_rows_in_a_file_sum_bit_for_bit_as_in_memory_and_read_back(tmp_path, small_chunks):
    rng = np.random.default_rng(1)
    rows = file_rows(str(tmp_path), "r.f32", 3, 2_345)
    memory = np.zeros((3, 2_345), dtype=np.float32)
    for _ in range(4):
        vector, coefficients = rng.standard_normal(2_345).astype(np.float32), rng.standard_normal(3)
        add_rows(rows, coefficients, vector)
        for i in range(3):
            memory[i] += np.float32(coefficients[i]) * vector
    for i in range(3):
        assert np.array_equal(read_row(rows, i), memory[i])
    np.testing.assert_allclose(gram(rows), memory.astype(np.float64) @ memory.T.astype(np.float64), rtol=1e-12)
    assert (tmp_path / "r.f32").stat().st_size == 3 * 2_345 * 4


def test_orthonormalised_rows_are_orthonormal_span_the_same_space_and_project_out_it(tmp_path, small_chunks):
    rng = np.random.default_rng(2)
    raw = rng.standard_normal((3, 5_000)).astype(np.float32)
    rows = file_rows(str(tmp_path), "q.f32", 3, 5_000)
    for i in range(3):
        add_rows(rows, np.eye(3)[i], raw[i])
    orthonormalise(rows)
    q = np.stack([read_row(rows, i) for i in range(3)]).astype(np.float64)
    np.testing.assert_allclose(q @ q.T, np.eye(3), atol=1e-6)
    reference = np.linalg.qr(raw.T.astype(np.float64))[0].T  # the same span: each projector is the other's
    np.testing.assert_allclose(q.T @ q, reference.T @ reference, atol=1e-6)
    v = rng.standard_normal(5_000)
    expected = v - q.T @ (q @ v)
    np.testing.assert_allclose(project_out(rows, v.copy()), expected, atol=1e-5)


def test_adding_to_rows_in_a_file_holds_a_chunk_not_the_rows(tmp_path):
    dim = 1 << 23  # 32 MB a row in float32: three rows are 96 MB
    rows = file_rows(str(tmp_path), "big.f32", 3, dim)
    vector = np.ones(dim, dtype=np.float32)
    tracemalloc.start()
    add_rows(rows, np.array([1.0, 2.0, 3.0]), vector)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4 * vectors.CHUNK * 4  # a few float32 chunks (16 MB each), not a 32 MB row
    assert isinstance(rows, FileRows) and read_row(rows, 2)[-1] == 3.0


def test_a_vector_in_a_file_dots_adds_and_sums_bit_for_bit_as_in_memory(tmp_path, small_chunks):
    rng = np.random.default_rng(3)
    x, y = (rng.standard_normal(4_321).astype(np.float32) for _ in range(2))
    in_file = file_rows(str(tmp_path), "x.f32", 1, 4_321)
    write_row(in_file, 0, x)
    assert dot(in_file, y) == dot(x, y)  # the same chunks, the same float64 sum of float32 dots
    assert np.array_equal(axpy(in_file, y.copy(), -0.7), axpy(x, y.copy(), -0.7))
    sums, memory = file_rows(str(tmp_path), "s.f32", 2, 4_321), file_rows(str(tmp_path), "m.f32", 2, 4_321)
    add_rows(sums, np.array([0.5, -2.0]), in_file)
    add_rows(memory, np.array([0.5, -2.0]), x)
    assert all(np.array_equal(read_row(sums, i), read_row(memory, i)) for i in range(2))


def test_a_part_written_and_read_back_lands_at_its_offset_and_nowhere_else(tmp_path, small_chunks):
    rows = file_rows(str(tmp_path), "p.f32", 2, 3_000)
    part = np.arange(2_500, dtype=np.float32)  # longer than a chunk: written in three
    write_part(rows, 1, 300, part)
    assert np.array_equal(read_part(rows, 1, 300, 2_800), part)
    assert not read_part(rows, 1, 0, 300).any() and not read_part(rows, 1, 2_800, 3_000).any()
    assert not read_row(rows, 0).any()
