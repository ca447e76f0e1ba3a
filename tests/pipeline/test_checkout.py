"""Every stage runs the code of the checkout it is in: two clones sharing one interpreter, the other clone first
on PYTHONPATH (as an editable install of it would be), each stage importing its own clone's topometrics; and
experiments queued with `dvc exp run --queue`, run in parallel in copies of the project, each the code it was
queued with."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tools.same_results import copy_pipeline, project_env

REPO = Path(__file__).resolve().parents[2]
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


# Appended to the project's topometrics/training/train.py: the config stage's files then say which code wrote them.
# The queued edits also wait at import (at most WAIT_S) until a second experiment carrying such code has got as far,
# so a file saying "met": 2 was written while another experiment was running.
MARK = """
_to_dict = RunConfig.to_dict
RunConfig.to_dict = lambda self: _to_dict(self) | {{"code": {mark!r}}}
"""
MEET = """
import time as _time
from pathlib import Path as _Path

_met = _Path({met!r})
(_met / {mark!r}).write_text(__file__)  # where this code was imported from
_until = _time.monotonic() + {wait_s}
while len(list(_met.iterdir())) < 2 and _time.monotonic() < _until:
    _time.sleep(0.2)
_to_met = RunConfig.to_dict
RunConfig.to_dict = lambda self: _to_met(self) | {{"met": len(list(_met.iterdir()))}}
"""
WAIT_S = 180
QUEUED = {"lr1": (0.001, None), "lr2": (0.002, "A"), "lr4": (0.004, "B")}  # name: (train.lr, code mark)


def dvc(project: Path, *args: str) -> str:
    proc = subprocess.run(["dvc", *args], cwd=project, env=project_env(project), capture_output=True, text=True)
    assert proc.returncode == 0, f"dvc {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def queue_status(project: Path) -> dict[str, str]:
    """Each queued experiment's state (Queued, Running, Success, Failed) by name, from `dvc queue status`."""
    rows = (line.split() for line in dvc(project, "queue", "status").splitlines())
    return {row[1]: row[-1] for row in rows if len(row) > 2 and row[1] in QUEUED}


@pytest.mark.slow
def test_queued_experiments_run_in_parallel_each_with_the_params_and_code_it_was_queued_with(tmp_path):
    """`dvc exp run --queue` x3 and `dvc queue start -j 2`: two experiments run at the same time, each in its own
    copy under .dvc/tmp/exps/, and each one's config stage ran the code and params of the moment it was queued
    (the first the committed code, the others two later staged edits of topometrics), not the workspace's code
    as edited after queueing, though the workspace comes first on PYTHONPATH; `dvc exp show` lists all three."""
    project = tmp_path / "project"
    copy_pipeline(REPO, project)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["data"] |= {"urls": [], "seq_len": 32, "val_windows": 8}  # the offline fallback corpus: no network
    params["ladder"] = {"a": {"hidden": 8, "layers": 1, "heads": 1}}  # one run: a-42
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    for key, value in (("user.email", "tests@topometrics.invalid"), ("user.name", "topometrics tests")):
        subprocess.run(["git", "config", key, value], cwd=project, check=True)  # experiments are commits
    subprocess.run(["git", "add", "-A"], cwd=project, check=True)
    subprocess.run(["git", "commit", "-qm", "tiny"], cwd=project, check=True)

    met = tmp_path / "met"  # outside the project: every experiment's copy sees the same folder
    met.mkdir()
    train = project / "topometrics" / "training" / "train.py"
    committed = train.read_text()
    for name, (lr, mark) in QUEUED.items():
        if mark:  # a staged edit: the queue snapshots the workspace, staged changes included
            train.write_text(committed + MARK.format(mark=mark) + MEET.format(met=str(met), mark=mark, wait_s=WAIT_S))
            subprocess.run(["git", "add", str(train)], cwd=project, check=True)
        dvc(project, "exp", "run", "--queue", "-n", name, "-S", f"train.lr={lr}", "config")
    # Edited again after queueing: a stage importing the workspace's topometrics (PYTHONPATH, project_env) instead
    # of its own copy's would write "C".
    train.write_text(committed + MARK.format(mark="C"))

    dvc(project, "queue", "start", "-j", "2")
    try:
        deadline = time.monotonic() + 3 * WAIT_S
        while set((states := queue_status(project)).values()) - {"Success", "Failed"} and time.monotonic() < deadline:
            time.sleep(2)
        failed = [dvc(project, "queue", "logs", name) for name, state in states.items() if state == "Failed"]
        assert states == dict.fromkeys(QUEUED, "Success"), (states, failed)
    finally:  # the workers this test started (they stop by themselves once the queue is empty)
        subprocess.run(["dvc", "queue", "stop", "--kill"], cwd=project, env=project_env(project), check=False)
        while "0 active, 0 idle" not in dvc(project, "queue", "status") and time.monotonic() < deadline + 60:
            time.sleep(1)

    shown = json.loads(dvc(project, "exp", "show", "--json"))
    exps = {rev["name"]: rev for exp in shown[1]["experiments"] for rev in exp["revs"]}
    assert sorted(exps) == sorted(QUEUED)
    hashes = set()
    for name, (lr, mark) in QUEUED.items():
        data = exps[name]["data"]
        assert data["params"]["params.yaml"]["data"]["train"]["lr"] == lr
        hashes.add(data["outs"]["data/config"]["hash"])
        cmd = ["git", "show", f"{exps[name]['rev']}:data/config/a-42.json"]  # cache: false, in the commit
        config = json.loads(subprocess.run(cmd, cwd=project, check=True, capture_output=True, text=True).stdout)
        assert config["recipe"]["lr"] == lr
        assert config.get("code") == mark  # the code as queued: none, "A", "B", never the workspace's "C"
        assert config.get("met") == (2 if mark else None)  # A and B ran at the same time (the first one waited)
    assert len(hashes) == 3
    copies = {(met / mark).read_text() for mark in ("A", "B")}  # two copies of the project, not the workspace
    assert len(copies) == 2 and all(path.startswith(f"{project}/.dvc/tmp/exps/") for path in copies), copies
