"""topometrics.analysis.forecast: a run's forecast line from the forecaster topometrics.verdict.live fits."""

from __future__ import annotations

import pytest

from tests.verdict.helpers import CHAR, _runs
from topometrics.analysis import forecast
from topometrics.verdict import live


def test_a_run_of_another_tokenizer_or_unit_is_refused_in_one_line():
    model = live.fit_forecaster(_runs(10), CHAR, "nats")
    with pytest.raises(forecast.ForecastError) as err:
        forecast.forecast_line(model, 0.2, 2.5, {"kind": "bpe", "vocab_size": 4096}, "nats")
    assert str(err.value) == (
        "the forecaster was fitted on tokenizer {'kind': 'char'}, this run uses {'kind': 'bpe', 'vocab_size': 4096}; "
        "fit one on a sweep of this tokenizer"
    )
    with pytest.raises(forecast.ForecastError, match="predicts nats, this run's loss is in bpb"):
        forecast.forecast_line(model, 0.2, 2.5, CHAR, "bpb")
    with pytest.raises(forecast.ForecastError, match="no forecaster at fraction 0.5; fitted at 0.2"):
        forecast.forecast_line(model, 0.5, 2.5, CHAR, "nats")
