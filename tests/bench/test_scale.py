"""The scale benchmark's job: streamed weight features of a Pythia-shaped file equal the in-memory ones."""

import numpy as np
from safetensors.numpy import load_file

from bench.scale import pythia_70m_shapes, weight_shard
from bench.series import write_random_safetensors
from tests.repo_params import features_params
from topometrics.features.checkpoint import weight_features


def test_weight_shard_equals_weight_features_of_the_loaded_layers(tmp_path, monkeypatch):
    import bench.scale as scale

    monkeypatch.setitem(scale.PYTHIA_70M, "hidden", 16)  # the 70M layout at a test's size
    monkeypatch.setitem(scale.PYTHIA_70M, "intermediate", 64)
    monkeypatch.setitem(scale.PYTHIA_70M, "vocab", 50)
    path = tmp_path / "step3000.safetensors"
    write_random_safetensors(path, pythia_70m_shapes(), "float16", seed=3)
    tables = weight_shard(str(path))
    state = load_file(str(path))
    parts = ("attention.query_key_value", "attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h")
    weights = {f"{i}.{p}": state[f"gpt_neox.layers.{i}.{p}.weight"].astype(np.float32) for i in range(6) for p in parts}
    expected = weight_features(weights, features_params())
    got = tables["features"]
    assert set(got["step"]) == {3000} and set(got["rung"]) == {"pythia-70m"}
    mine = got[got["layer"] == "all"].set_index("feature")["value"]
    theirs = {name: value for layer, name, value, _ in expected.rows if layer == "all"}
    assert set(theirs) <= set(mine.index)
    for name, value in theirs.items():
        assert mine[name] == value or (np.isnan(mine[name]) and np.isnan(value)), name


def test_each_job_records_its_own_peak_memory_over_its_start(tmp_path, monkeypatch):
    import bench.scale as scale

    monkeypatch.setattr(scale, "JOB_PEAKS", [])
    path = tmp_path / "step0.safetensors"
    write_random_safetensors(path, pythia_70m_shapes(scale.SMALL), "float16", seed=0)
    weight_shard(str(path))
    weight_shard(str(path))
    peaks = scale.job_peaks()
    assert len(peaks) == 2 and all(0 <= p < 2**30 for p in peaks)
    assert scale.job_peaks() == []  # read once
    assert scale.peak_rss() >= scale.reset_peak_rss() > 0
