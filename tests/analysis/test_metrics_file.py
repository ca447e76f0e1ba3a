"""topometrics.analysis.metrics_file: the metrics.json DVC shows, from the pipeline's warehouse."""

import json
import math
import re

import duckdb
import pytest

from tests.analysis.helpers import RUNGS
from tests.repo_params import analysis_params
from topometrics.analysis import metrics_file


def test_metrics_file_is_the_headline_a_column_per_rung_at_most(pipeline):
    text = pipeline[1].read_text()
    metrics = json.loads(text)
    assert set(metrics) == {"corpus", "final_val_loss", "rho", "runs", "diverged_runs", "verdict"}
    assert metrics["corpus"] == {"used": "python-docs", "fallback": True}
    assert set(metrics["final_val_loss"]) == set(RUNGS) and metrics["runs"] == len(RUNGS)
    assert metrics["rho"]["vr_tp0"] < -0.9 and set(metrics["rho"]) <= set(analysis_params().headline_features)
    assert metrics["verdict"]["cv"] == "rung" and set(metrics["verdict"]) == {"cv", "f20", "f30", "f50"}
    columns = _leaves(metrics)  # what `dvc exp show` makes a column of
    assert len(columns) <= len(RUNGS) + 6 + 1 + 9 + 4, columns  # rungs, rho, verdict cv, 3 x 3 verdict, the rest
    numbers = re.findall(r"-?\d+\.?\d*(?:e-?\d+)?", text)
    assert numbers and all(math.isfinite(float(n)) for n in numbers)
    assert "NaN" not in text and "Infinity" not in text


def _leaves(tree: dict, prefix: str = "") -> list[str]:
    """The dotted keys of a nested dict's leaves (the columns `dvc exp show` lists for a metrics file)."""
    out = []
    for key, value in tree.items():
        out += _leaves(value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}"]
    return out


def test_metrics_follow_the_params_and_equal_the_stages_file(pipeline):
    with duckdb.connect(str(pipeline[0]), read_only=True) as c:
        assert metrics_file.metrics_json(metrics_file.build_metrics(c, analysis_params())) == pipeline[1].read_text()
        fewer = metrics_file.build_metrics(c, analysis_params(headline_features=("vr_tp1",)))
        final = dict(c.execute("SELECT rung, val_loss FROM final_checkpoints").fetchall())
    assert list(fewer["rho"]) == ["vr_tp1"]
    assert fewer["final_val_loss"] == pytest.approx(final, rel=1e-5)


def test_the_verdicts_comparisons_go_to_the_seams_pool_from_32_declared_runs():
    from topometrics.execution import compute

    assert metrics_file.comparisons_map(metrics_file.POOL_MIN_RUNS - 1) is None  # a small project: here
    pooled = metrics_file.comparisons_map(metrics_file.POOL_MIN_RUNS)
    assert pooled.func is compute.map_jobs and pooled.keywords["workers"] == compute.usable_cores()
    assert pooled(lambda x: x, []) == []  # it maps: nothing in, nothing out
