"""Atomic writes and the content hash that verifies what they wrote."""

import hashlib
import os

import pytest

from topometrics.atomic import file_sha256, write_bytes
from topometrics.errors import DiskFullError


def test_file_sha256_is_hashlib_of_the_bytes_in_order(tmp_path):
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(os.urandom(3 * 2**20 + 5))  # more than one 1 MiB block
    b.write_bytes(b"tail")
    assert file_sha256(a) == hashlib.sha256(a.read_bytes()).hexdigest()
    assert file_sha256(a, b) == hashlib.sha256(a.read_bytes() + b"tail").hexdigest()


def test_a_failed_write_keeps_the_previous_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "f.bin"
    write_bytes(path, b"old")
    with pytest.raises(TypeError):
        write_bytes(path, "not bytes")
    assert path.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]


def test_a_full_disk_is_one_error_naming_the_file_and_the_previous_version_is_kept(tiny_disk):
    disk = tiny_disk("256k")
    path = disk / "weights.bin"
    write_bytes(path, b"the previous version")
    message = (f"{path}: no space left on its disk; free space there (or point the output elsewhere) and rerun "
               "`dvc repro`: finished work is kept and only what was being written is redone")  # fmt: skip
    with pytest.raises(DiskFullError) as err:
        write_bytes(path, os.urandom(1 << 20))
    assert str(err.value) == message
    assert path.read_bytes() == b"the previous version" and sorted(p.name for p in disk.iterdir()) == ["weights.bin"]
