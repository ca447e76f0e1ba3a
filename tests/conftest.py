"""Shared fixtures: one tiny pipeline reproduced once per test process, copied per test."""

import shutil
from pathlib import Path

import pytest
import yaml
from test_pipeline import commit, make_project, run


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


def failing(args: list[str], cwd: Path) -> str:
    """Output of a command that must fail (test_pipeline.run raises with stdout and stderr)."""
    with pytest.raises(AssertionError) as err:
        run(args, cwd)
    return str(err.value)


def error_lines(output: str) -> list[str]:
    """The stage's one-line errors in a command's output (and no traceback)."""
    assert "Traceback" not in output, output
    return [line for line in output.splitlines() if line.startswith("error: ")]


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path: to show that nothing was lost or changed."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
