"""Helpers shared by the tests that run the pipeline: a tiny git+DVC project made from this repository, running
a command in it with DVC's environment, what a failing command printed, and every file under a folder."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tools.same_results import copy_pipeline

REPO = Path(__file__).resolve().parents[2]


TINY = {
    "data": {"corpus": "wikitext-2-raw-v1", "urls": [], "val_windows": 8, "seq_len": 32},
    "train": {"steps": 40, "ckpt_every": 10, "batch_size": 8, "warmup": 2, "threads": 1, "hidden": 8, "heads": 2},
    "ladder": {"a": {"hidden": 8, "layers": 1, "heads": 1}, "b": {}},
    "features": {"rep_points": 64, "rep_batch": 4, "max_points": 32, "workers": 1},
    "analysis": {"bootstrap": 50},
}


def dvc_env() -> dict:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    env["DVC_NO_ANALYTICS"] = "1"
    env["HF_HUB_OFFLINE"] = "1"  # the series stage records Pythia as skipped instead of trying the network
    return env


def run(args: list[str], cwd: Path) -> str:
    proc = subprocess.run(args, cwd=cwd, env=dvc_env(), capture_output=True, text=True)
    if proc.returncode:
        raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout + proc.stderr


def make_project(root: Path) -> Path:
    """A git+DVC project with this repository's pipeline and a tiny params.yaml."""
    copy_pipeline(REPO, root)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for section, values in TINY.items():
        params[section] = values if section == "ladder" else params[section] | values
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(["git", "init", "-q"], root)
    run(["git", "config", "user.email", "tests@topometrics.invalid"], root)  # dvc exp commits need an identity
    run(["git", "config", "user.name", "topometrics tests"], root)
    commit(root, "tiny")
    return root


def commit(root: Path, message: str) -> None:
    run(["git", "add", "-A"], root)
    run(["git", "commit", "-qm", message], root)


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
