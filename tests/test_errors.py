"""One line per user mistake: the stage wrapper, the error classes, and the stage scripts' messages."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from topometrics.analysis.warehouse import WarehouseError
from topometrics.errors import TRACEBACK_ENV, TopometricsError, one_line, run_stage
from topometrics.execution.cluster import ClusterError
from topometrics.execution.shards import ShardError
from topometrics.models.checkpoints import CheckpointError
from topometrics.params import ParamsError
from topometrics.training.corpus import CorpusError

REPO = Path(__file__).resolve().parents[1]
STAGES = sorted(p for p in (REPO / "stages").glob("*.py") if p.name != "checkout.py")  # checkout: imported first


def test_every_project_error_is_a_topometrics_error():
    for cls in (ParamsError, CorpusError, CheckpointError, WarehouseError, ClusterError, ShardError):
        assert issubclass(cls, TopometricsError)
    assert issubclass(ParamsError, ValueError)  # callers that caught the old bases still do


def test_a_user_mistake_is_one_line_on_stderr_and_exit_1(capsys, monkeypatch):
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)

    def main(argv):
        raise ParamsError(f"unknown param train.{argv[0]}; known keys: steps\nsecond line")

    with pytest.raises(SystemExit) as exit_:
        run_stage(main, ["hiden"])
    assert exit_.value.code == 1
    out, err = capsys.readouterr()
    assert out == "" and err == "error: unknown param train.hiden; known keys: steps | second line\n"


def test_the_traceback_switch_shows_a_user_mistake_as_an_exception(monkeypatch):
    monkeypatch.setenv(TRACEBACK_ENV, "1")
    with pytest.raises(CorpusError, match="too small"):
        run_stage(lambda argv: (_ for _ in ()).throw(CorpusError("too small")), [])


def test_a_bug_keeps_its_traceback(monkeypatch):
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    with pytest.raises(ZeroDivisionError):
        run_stage(lambda argv: 1 / 0, [])


def test_one_line_of_an_empty_message_names_the_error_type():
    assert one_line(CheckpointError()) == "error: CheckpointError"


def test_every_stage_script_runs_main_in_the_wrapper_with_the_shared_parser():
    for script in STAGES:
        text = script.read_text()
        assert "run_stage(main)" in text and "stage_parser(__doc__)" in text, script.name
        assert "def main(argv: list[str]) -> None:" in text, script.name


def _stage(script: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "stages" / script), *args], cwd=cwd, capture_output=True,
                          text=True, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})  # fmt: skip


def test_stage_scripts_answer_mistakes_in_one_line(tmp_path):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["ladder"]["tiny"]["heads"] = 3
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    cases = {
        ("config.py", "--corpus", "corpus", "--out", "config"): (
            "error: ladder.tiny: hidden=8 is not divisible by heads=3; set ladder.tiny.heads to a divisor of hidden"
        ),
        ("report.py", "--warehouse", "nowhere.duckdb", "--series-status", "status.json", "--out", "reports"): (
            "error: nowhere.duckdb not found; build it with `dvc repro warehouse`"
        ),
    }
    for (script, *args), message in cases.items():
        proc = _stage(script, args, tmp_path)
        assert (proc.returncode, proc.stderr) == (1, message + "\n"), proc.stderr
    # a pre-registered endpoint the sweep cannot answer stops the config stage, before any run is trained
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["analysis"]["primary"] = {"family": "landscape", "features": ["ls_hess_tp"], "fraction": 0.3, "cv": "rung"}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))  # one recipe per rung: no cell permutation
    proc = _stage("config.py", ["--corpus", "corpus", "--out", "config"], tmp_path)
    assert (proc.returncode, proc.stderr) == (
        1,
        "error: analysis.primary: the between-cell test permutes recipes within each rung: 1 recipes per rung give "
        "a smallest p above alpha=0.05; declare >= 3 recipes per rung (variants); fix it in params.yaml before the "
        "sweep\n",
    )
    params["variants"] = {"lr_lo": {"lr": 0.001}, "lr_hi": {"lr": 0.006}}
    params["features"]["families"] = [f for f in params["features"]["families"] if f != "landscape"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    proc = _stage("config.py", ["--corpus", "corpus", "--out", "config"], tmp_path)
    assert (proc.returncode, proc.stderr) == (
        1,
        "error: analysis.primary: it reads the families ['landscape'], which "
        "features.families leaves out; fix it in params.yaml before the sweep\n",
    )
    assert not (tmp_path / "config").exists()
    (tmp_path / "params.yaml").write_text("data: {corpus: x\n")
    proc = _stage("corpus.py", ["--out", "corpus"], tmp_path)
    assert proc.returncode == 1 and proc.stderr.startswith("error: params.yaml (line 2) is not valid YAML: ")
    assert len(proc.stderr.splitlines()) == 1 and not (tmp_path / "corpus").exists()
