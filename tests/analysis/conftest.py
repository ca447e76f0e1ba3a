"""Fixtures of the analysis tests: the analysis and warehouse stages run once, as DVC runs them, on synthetic rungs."""

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from tests.analysis.helpers import write_inputs

REPO = Path(__file__).resolve().parents[2]


def _stage(name: str, *args) -> None:
    env = os.environ | {"PYTHONPATH": str(REPO)}
    cmd = [sys.executable, str(REPO / "stages" / f"{name}.py"), "--params", str(REPO / "params.yaml"), *map(str, args)]
    subprocess.run(cmd, check=True, env=env, capture_output=True, text=True)


@pytest.fixture(scope="package")  # read only: every analysis test file shares one build
def pipeline(tmp_path_factory):
    """Both stages as DVC runs them, on five synthetic rungs: the warehouse file and metrics.json."""
    data = tmp_path_factory.mktemp("pipe") / "data"
    write_inputs(data)
    common = ["--configs", data / "config", "--runs", data / "runs", "--corpus", data / "corpus" / "source.json"]
    common += ["--features", data / "features"]
    metrics = data.parent / "reports" / "metrics.json"
    _stage("analysis", *common, "--out", data / "analysis", "--metrics", metrics)
    _stage("warehouse", *common, "--analysis", data / "analysis", "--out", data / "warehouse.duckdb")
    return data / "warehouse.duckdb", metrics


@pytest.fixture()
def con(pipeline):
    with duckdb.connect(str(pipeline[0]), read_only=True) as c:
        yield c
