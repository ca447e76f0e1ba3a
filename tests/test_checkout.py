"""Every stage runs the code of the checkout it is in: two clones sharing one interpreter, the other clone first
on PYTHONPATH (as an editable install of it would be), each stage importing its own clone's topometrics."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.same_results import copy_pipeline

REPO = Path(__file__).resolve().parents[1]
STAGES = sorted(p.stem for p in (REPO / "stages").glob("*.py") if p.stem != "checkout")


def clone(root: Path) -> Path:
    """A copy of the pipeline whose topometrics says where it was imported from."""
    copy_pipeline(REPO, root)
    init = root / "topometrics" / "__init__.py"
    init.write_text(init.read_text() + "\nprint('topometrics from', __file__)\n")
    return root


@pytest.fixture(scope="module")
def clones(tmp_path_factory):
    root = tmp_path_factory.mktemp("clones")
    return clone(root / "a"), clone(root / "b")


@pytest.mark.parametrize("stage", STAGES)
def test_a_stage_imports_the_topometrics_of_its_own_checkout_whatever_comes_first_on_the_path(clones, stage):
    for own, other in (clones, clones[::-1]):
        env = dict(os.environ, PYTHONPATH=str(other))  # the other clone would win without stages/checkout.py
        cmd = [sys.executable, str(own / "stages" / f"{stage}.py"), "--help"]
        proc = subprocess.run(cmd, cwd=own, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        imported = [line for line in proc.stdout.splitlines() if line.startswith("topometrics from ")]
        assert imported == [f"topometrics from {own / 'topometrics' / '__init__.py'}"]
