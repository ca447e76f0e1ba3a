"""topometrics.features.monitor_measure: a monitor's worker writes a snapshot's weight features to the log."""

import numpy as np
import torch

from tests.repo_params import features_params
from topometrics.execution.shards import module_source_hash, params_digest
from topometrics.features.checkpoint import weight_features
from topometrics.features.monitor_measure import DIVERGED, measure, measured_with
from topometrics.models.model import GPT, GPTConfig, linear_weights
from topometrics.training.monitor_log import measured_with as recorded_with
from topometrics.training.monitor_log import measurement_parts, read_log

PARAMS = features_params(max_points=20, workers=1)


def snapshot(seed: int) -> dict[str, tuple[np.ndarray, bool]]:
    model = GPT(GPTConfig(hidden=16, layers=1, heads=2))
    model.init_weights(torch.Generator().manual_seed(seed))
    return {name: (w, False) for name, w in linear_weights(model.state_dict(), 1).items()}


def test_a_snapshots_log_rows_are_its_weight_features_and_the_summary_is_layer_all(tmp_path):
    weights = snapshot(0)
    summary = measure(tmp_path, weights, PARAMS, "t", 7, 30)
    rows, _ = read_log(tmp_path)
    expected = weight_features({name: w for name, (w, _) in weights.items()}, PARAMS)
    got = {(r.layer, r.feature): r.value for r in rows.itertuples()}
    assert got.keys() == {(layer, feature) for layer, feature, _, _ in expected.rows}
    for layer, feature, value, _ in expected.rows:
        assert got[(layer, feature)] == value or (np.isnan(value) and np.isnan(got[(layer, feature)]))
    assert set(rows["step"]) == {30} and set(rows["rung"]) == {"t"} and set(rows["seed"]) == {7}
    assert summary["np_norm"] == got[("all", "np_norm")] and summary["_seconds"] > 0
    assert summary["_surface_seconds"] >= 0


def test_a_non_finite_weight_makes_every_weight_feature_null_with_the_reason(tmp_path):
    weights = snapshot(1)
    name = next(iter(weights))
    weights[name][0][0, 0] = np.inf
    measure(tmp_path, weights, PARAMS, "t", 7, 5)
    rows, _ = read_log(tmp_path)
    assert rows["value"].isna().all() and set(rows["reason"]) == {DIVERGED}
    assert {"np_norm", "vr_tp0"} <= set(rows["feature"])


def test_each_part_records_this_modules_code_and_the_params_digest(tmp_path):
    made = measured_with(PARAMS)
    assert made == {"code": module_source_hash("topometrics.features.monitor_measure"), "params": params_digest(PARAMS)}
    measure(tmp_path, snapshot(2), PARAMS, "t", 7, 0)
    (part,) = measurement_parts(tmp_path)
    assert recorded_with(part) == made
    assert measured_with(features_params(max_points=21, workers=1))["params"] != made["params"]
