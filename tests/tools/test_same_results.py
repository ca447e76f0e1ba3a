"""tools/same_results.py: two reproductions compare equal only when every table and checkpoint does."""

import json
import shutil

import pandas as pd
import pytest
import torch
from safetensors.torch import save_file

from tools.same_results import compare


def dump(root, value=1.0, rho=0.5, weight=0.0):
    """A dump as `make` writes it: one table, one view, a checkpoint and a resume state."""
    (root / "tables").mkdir(parents=True)
    pd.DataFrame({"rung": ["a"], "value": [value]}).to_parquet(root / "tables" / "features.parquet")
    pd.DataFrame({"rung": ["a"], "rho": [rho]}).to_parquet(root / "tables" / "feature_loss_spearman.parquet")
    (root / "tables.json").write_text(json.dumps([["feature_loss_spearman", "VIEW"], ["features", "BASE TABLE"]]))
    runs = root / "project" / "data" / "runs" / "a-42"
    runs.mkdir(parents=True)
    save_file({"w": torch.full((2, 2), weight)}, str(runs / "step_000000.safetensors"))
    save_file({"w": torch.zeros(2)}, str(runs / "resume.safetensors"), {"step": "0"})
    hashes = {f"data/runs/a-42/{p.name}": p.read_bytes().hex() for p in runs.iterdir()}
    (root / "runs.json").write_text(json.dumps(hashes))
    return root


def test_identical_dumps_compare_equal_and_parallel_aggregates_within_1e_12(tmp_path):
    assert compare(dump(tmp_path / "a"), dump(tmp_path / "b", rho=0.5 + 1e-15))


@pytest.mark.parametrize("change", [{"value": 1.0 + 1e-15}, {"rho": 0.51}, {"weight": 1.0}])
def test_any_other_difference_is_found(tmp_path, change):
    assert not compare(dump(tmp_path / "a"), dump(tmp_path / "b", **change))


def test_a_missing_view_is_found(tmp_path):
    a, b = dump(tmp_path / "a"), dump(tmp_path / "b")
    (b / "tables.json").write_text(json.dumps([["features", "BASE TABLE"]]))
    shutil.rmtree(b / "project")
    shutil.copytree(a / "project", b / "project")
    assert not compare(a, b)
