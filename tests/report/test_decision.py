"""topometrics.report.decision: the first screen's compute-saved vs regret curve and the coverage table."""

from __future__ import annotations

import pandas as pd

from tests.verdict.helpers import KINDS, _sweep
from topometrics.report import decision, html
from topometrics.report.contents import Report
from topometrics.report.frames import Missing
from topometrics.verdict import stopping


def test_the_curve_shows_the_best_baseline_and_the_best_family_through_the_kill_shares():
    resampling = stopping.Resampling(0.05, n_boot=20)
    table = pd.concat([stopping.decision_table(_sweep(0), KINDS, f, "seed", resampling) for f in (0.2, 0.5)])
    spec = decision.stopping_curve(table).to_dict()
    rows = pd.DataFrame(spec["data"]["values"])
    assert set(rows["predictor"]) == {"current loss", "norm+oracle"}  # the oracle family beats the noise
    assert sorted(rows["kill_share"].unique()) == [0.25, 0.5, 0.75] and set(rows["scope"]) == {"sweep"}
    assert spec["encoding"]["x"]["field"] == "saved" and spec["encoding"]["y"]["field"] == "p_best_killed"
    report = Report({}, None, False, verdict_figures={"stopping_curve": decision.stopping_curve(table)})
    assert html.lead_figure(report) == "stopping_curve"  # the first screen


def test_a_sweep_too_small_shows_why_instead_of_a_curve():
    table = stopping.decision_table(_sweep(1).iloc[:3], KINDS, 0.2, "seed", stopping.Resampling(0.05, n_boot=5))
    found = decision.stopping_curve(table)
    assert isinstance(found, Missing) and "needs at least 4 runs" in found.reason


def test_coverage_table_puts_the_measured_share_beside_each_nominal_level():
    coverage = pd.DataFrame({
        "cv": "seed", "level": "between", "fraction": 0.2, "predictor": "norm", "kind": "baseline",
        "nominal": [0.8, 0.95], "n": [40, 40], "covered": [0.775, 0.95], "shortfall": [-0.025, 0.0],
        "half_width": [0.1, 0.2],
    })  # fmt: skip
    table = decision.coverage_table(coverage)
    assert table.loc[0, "measured (80 %)"] == 0.775 and table.loc[0, "measured (95 %)"] == 0.95
    assert table.loc[0, "runs (80 %)"] == 40
