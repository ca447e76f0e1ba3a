"""topometrics.landscape.vectors: float32 dots against float64 ones, in-place axpy, and rows in a file against
the same arithmetic in memory (sums bit for bit, the Gram matrix, Cholesky QR's orthonormality and span, the
projection), holding a chunk of a row, not the rows; the files have no name and close with their stack; a
memory filesystem is not where they go."""

import contextlib
import os
import tempfile
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
    in_memory,
    norm,
    orthonormalise,
    project_out,
    read_part,
    read_row,
    scratch_folder,
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


def test_rows_in_a_file_sum_bit_for_bit_as_in_memory_and_read_back(scratch, small_chunks):
    rng = np.random.default_rng(1)
    rows = file_rows(scratch, 3, 2_345)
    memory = np.zeros((3, 2_345), dtype=np.float32)
    for _ in range(4):
        vector, coefficients = rng.standard_normal(2_345).astype(np.float32), rng.standard_normal(3)
        add_rows(rows, coefficients, vector)
        for i in range(3):
            memory[i] += np.float32(coefficients[i]) * vector
    for i in range(3):
        assert np.array_equal(read_row(rows, i), memory[i])
    np.testing.assert_allclose(gram(rows), memory.astype(np.float64) @ memory.T.astype(np.float64), rtol=1e-12)
    assert os.fstat(rows.fd).st_size == 3 * 2_345 * 4


def test_orthonormalised_rows_are_orthonormal_span_the_same_space_and_project_out_it(scratch, small_chunks):
    rng = np.random.default_rng(2)
    raw = rng.standard_normal((3, 5_000)).astype(np.float32)
    rows = file_rows(scratch, 3, 5_000)
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


def test_adding_to_rows_in_a_file_holds_a_chunk_not_the_rows(scratch):
    dim = 1 << 23  # 32 MB a row in float32: three rows are 96 MB
    rows = file_rows(scratch, 3, dim)
    vector = np.ones(dim, dtype=np.float32)
    tracemalloc.start()
    add_rows(rows, np.array([1.0, 2.0, 3.0]), vector)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4 * vectors.CHUNK * 4  # a few float32 chunks (16 MB each), not a 32 MB row
    assert isinstance(rows, FileRows) and read_row(rows, 2)[-1] == 3.0


def test_a_vector_in_a_file_dots_adds_and_sums_bit_for_bit_as_in_memory(scratch, small_chunks):
    rng = np.random.default_rng(3)
    x, y = (rng.standard_normal(4_321).astype(np.float32) for _ in range(2))
    in_file = file_rows(scratch, 1, 4_321)
    write_row(in_file, 0, x)
    assert dot(in_file, y) == dot(x, y)  # the same chunks, the same float64 sum of float32 dots
    assert np.array_equal(axpy(in_file, y.copy(), -0.7), axpy(x, y.copy(), -0.7))
    sums, memory = file_rows(scratch, 2, 4_321), file_rows(scratch, 2, 4_321)
    add_rows(sums, np.array([0.5, -2.0]), in_file)
    add_rows(memory, np.array([0.5, -2.0]), x)
    assert all(np.array_equal(read_row(sums, i), read_row(memory, i)) for i in range(2))


def test_a_part_written_and_read_back_lands_at_its_offset_and_nowhere_else(scratch, small_chunks):
    rows = file_rows(scratch, 2, 3_000)
    part = np.arange(2_500, dtype=np.float32)  # longer than a chunk: written in three
    write_part(rows, 1, 300, part)
    assert np.array_equal(read_part(rows, 1, 300, 2_800), part)
    assert not read_part(rows, 1, 0, 300).any() and not read_part(rows, 1, 2_800, 3_000).any()
    assert not read_row(rows, 0).any()


def test_rows_live_in_a_file_with_no_name_that_closes_with_its_stack(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with contextlib.ExitStack() as stack:
        rows = write_row(file_rows(stack, 2, 1_000), 1, np.arange(1_000, dtype=np.float32))
        assert os.fstat(rows.fd).st_nlink == 0 and list(tmp_path.iterdir()) == []  # no name: nothing to leave
        assert np.array_equal(read_row(rows, 1), np.arange(1_000)) and not read_row(rows, 0).any()
    with pytest.raises(OSError):
        os.fstat(rows.fd)  # closed with the stack (its disk is freed with it)


MOUNTS = """\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 0:26 / /tmp rw,nosuid,nodev shared:12 - tmpfs tmpfs rw,size=8g
31 30 0:27 / /tmp/on\\040disk rw shared:13 - xfs /dev/vdb rw
32 22 0:28 / /var/tmpfs rw shared:14 - ramfs ramfs rw
"""


def test_a_folder_is_in_memory_by_its_deepest_mount():
    assert in_memory("/tmp", MOUNTS) and in_memory("/tmp/x/y", MOUNTS) and in_memory("/var/tmpfs/a", MOUNTS)
    assert not in_memory("/", MOUNTS) and not in_memory("/var/tmp", MOUNTS) and not in_memory("/tmpx", MOUNTS)
    assert not in_memory("/tmp/on disk/z", MOUNTS)  # a disk mounted inside the tmpfs (the name's space escaped)
    assert not in_memory("/tmp", "garbage\n")


def test_a_temporary_folder_in_memory_sends_the_files_to_var_tmp(tiny_disk, monkeypatch):
    memory = tiny_disk("64k")  # a real tmpfs, as Debian 13 mounts /tmp
    with open("/proc/self/mountinfo") as f:
        table = f.read()
    assert in_memory(str(memory), table)
    monkeypatch.setattr(tempfile, "tempdir", str(memory))
    expected = str(memory) if in_memory("/var/tmp", table) else "/var/tmp"
    assert scratch_folder() == expected
    own = str(memory.parent)  # the test's own folder: on a disk here, so kept
    if not in_memory(own, table):
        monkeypatch.setattr(tempfile, "tempdir", own)
        assert scratch_folder() == own
