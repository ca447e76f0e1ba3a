"""Shared fixtures: one tiny pipeline reproduced once per test process, copied per test; a real small disk;
the stack that closes unnamed vector files."""

import contextlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.pipeline.helpers import commit, make_project, run

# A test that imports a stage (``from stages.train import observers``) runs its ``import checkout`` as
# ``python stages/train.py`` would find it; appended, so nothing in stages/ shadows an installed module.
sys.path.append(str(Path(__file__).resolve().parents[1] / "stages"))


@pytest.fixture(scope="session")
def _reproduced_once(tmp_path_factory) -> Path:
    """A git+DVC project of a one-rung tiny ladder after a full `dvc repro`, committed."""
    project = make_project(tmp_path_factory.mktemp("reproduced") / "project")
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["ladder"] = {"a": {"layers": 1, "heads": 1}}  # hidden 8 from train's: `-S train.hidden=…` reaches it
    params["series"]["sources"] = {}
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(["dvc", "repro"], project)
    commit(project, "reproduced")
    return project


@pytest.fixture
def reproduced(_reproduced_once, tmp_path) -> Path:
    """A private copy of the reproduced tiny project (git history, DVC cache and outputs)."""
    copy = tmp_path / "project"
    shutil.copytree(_reproduced_once, copy, symlinks=True)
    return copy


@pytest.fixture
def tiny_disk(tmp_path):
    """``mount(size)``: a real filesystem of ``size`` (a tmpfs, e.g. '256k') at a fresh folder, unmounted after
    the test, so writes there meet a full disk. Mounting needs root: elsewhere the test is skipped, saying so."""
    mounted = []

    def mount(size: str) -> Path:
        folder = tmp_path / f"disk{len(mounted)}"
        folder.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                              capture_output=True, text=True)  # fmt: skip
        if proc.returncode:
            pytest.skip(f"a full disk is made with a tmpfs, which this user cannot mount: {proc.stderr.strip()}")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", "--lazy", str(folder)], check=True)


@pytest.fixture
def scratch():
    """The stack ``landscape.vectors.file_rows`` enters its unnamed files on, closed after the test."""
    with contextlib.ExitStack() as stack:
        yield stack
