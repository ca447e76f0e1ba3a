"""Where a live run is heading: its predicted final loss, with intervals, from the analysis stage's forecaster.

:func:`forecast_line` reads ``data/analysis/live_forecast.json`` (written by the analysis stage from
:func:`topometrics.verdict.live.fit_forecaster`; plain JSON, no pickle) and turns a run's current loss at a
fraction of training into one line a user watching the run (or :class:`~topometrics.features.monitor.
TopologyMonitor`'s caller) prints. A run of another tokenizer or loss unit, or a fraction the sweep did not
fit, is refused with one line (:class:`ForecastError`). It lives beside the stage that writes the file
(``metrics_file.write_analysis``) and imports the standard library only: a live run reads it without DuckDB or pandas.
"""

from __future__ import annotations

import json
from pathlib import Path

from topometrics.errors import TopometricsError

FORMAT = "topometrics.live_forecast.v1"  # topometrics.verdict.live.FORMAT: the file this reader understands


class ForecastError(TopometricsError, ValueError):
    """A forecaster that does not apply to this run; the message names what differs and the fix."""


def load_forecaster(path: Path) -> dict:
    """The forecaster file, checked for its format."""
    try:
        model = json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError) as err:
        raise ForecastError(f"{path}: no readable forecaster ({err}); run `dvc repro analysis`") from err
    if model.get("format") != FORMAT:
        raise ForecastError(f"{path}: format {model.get('format')!r}, not {FORMAT!r}; rerun `dvc repro analysis`")
    return model


def forecast_line(model: dict, fraction: float, current_loss: float, tokenizer: dict, loss_unit: str) -> str:
    """``at 20 % of training: final loss 2.61 (80 %: 2.55-2.67, 95 %: 2.50-2.72) nats, from 36 runs``."""
    if tokenizer != model["tokenizer"]:
        raise ForecastError(f"the forecaster was fitted on tokenizer {model['tokenizer']}, this run uses {tokenizer}; "
                            "fit one on a sweep of this tokenizer")  # fmt: skip
    if loss_unit != model["loss_unit"]:
        raise ForecastError(f"the forecaster predicts {model['loss_unit']}, this run's loss is in {loss_unit}; "
                            "pass the loss in the forecaster's unit")  # fmt: skip
    fit = model["fractions"].get(f"{fraction:g}")
    if fit is None:
        raise ForecastError(f"no forecaster at fraction {fraction:g}; fitted at {', '.join(model['fractions'])}")
    centre = fit["a"] + fit["b"] * current_loss
    bands = []
    for level, half in fit["half_width"].items():
        band = "unbounded" if half is None else f"{centre - half:.3f}-{centre + half:.3f}"
        bands.append(f"{100 * float(level):.0f} %: {band}")
    at, unit = f"at {100 * fraction:.0f} % of training", model["loss_unit"]
    return f"{at}: final loss {centre:.3f} ({', '.join(bands)}) {unit}, from {fit['n']} runs"
