"""topometrics.verdict.live: the forecaster of the final loss, read back by analysis.forecast."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.verdict.helpers import CHAR, _runs
from topometrics.analysis import forecast
from topometrics.verdict import live


def test_the_forecaster_recovers_the_map_and_its_intervals_cover_new_runs(tmp_path):
    model = live.fit_forecaster(_runs(200), CHAR, "nats")
    fit = model["fractions"]["0.2"]
    assert fit["a"] == pytest.approx(0.5, abs=0.02) and fit["b"] == pytest.approx(0.9, abs=0.01)
    assert fit["half_width"]["0.95"] == pytest.approx(1.96 * 0.01, rel=0.2)
    path = tmp_path / "live_forecast.json"
    path.write_text(json.dumps(model))  # the file the analysis stage writes: plain JSON
    loaded = forecast.load_forecaster(path)
    new = _runs(400, seed=1)
    predicted = fit["a"] + fit["b"] * new["anchor"].to_numpy()
    inside = np.abs(new["actual"].to_numpy() - predicted) <= fit["half_width"]["0.95"]
    assert np.mean(inside) == pytest.approx(0.95, abs=0.03)  # 400 new runs: binomial SD 0.011
    line = forecast.forecast_line(loaded, 0.2, 2.5, CHAR, "nats")
    centre = fit["a"] + fit["b"] * 2.5
    assert line.startswith(f"at 20 % of training: final loss {centre:.3f} (80 %: ")
    assert line.endswith("nats, from 200 runs")


def test_too_few_runs_give_an_unbounded_interval_not_a_false_one():
    model = live.fit_forecaster(_runs(4), CHAR, "nats")  # 95 %: rank ceil(0.95 x 5) = 5 of 4 residuals
    assert model["fractions"]["0.2"]["half_width"]["0.95"] is None
    assert "95 %: unbounded" in forecast.forecast_line(model, 0.2, 2.5, CHAR, "nats")
    assert live.forecaster_file(_runs(4), {"tokenizer": {"vocab_size": 512}}, "bpb")["tokenizer"] == {
        "kind": "bpe", "vocab_size": 512}  # fmt: skip
