"""tools/compare_residual.py: the project's params and the paired statistics (its pure parts)."""

import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

from tools.compare_residual import FEATURES, paired, project_params
from topometrics.params import parse_params

BASE = yaml.safe_load((Path(__file__).resolve().parents[2] / "params.yaml").read_text())


def test_project_params_declare_the_rung_twice_with_one_shape_and_residual_off_in_the_copy():
    raw = project_params(BASE, "/some/corpus", "small", 1000, [1, 2, 3, 4])
    params = parse_params(raw)
    assert set(raw["ladder"]) == {"small", "small_nores"}
    assert params.rung_shape("small_nores") == params.rung_shape("small") | {"residual": False}
    assert params.rung_shape("small")["hidden"] == BASE["ladder"]["small"]["hidden"]
    assert tuple(params.features.families) == ("landscape", "curvature")
    assert params.features.landscape_every == 1
    assert (params.train.steps, list(params.train.seeds)) == (1000, [1, 2, 3, 4])
    assert raw["series"]["sources"] == {} and raw["data"]["corpus"] == "/some/corpus"
    assert BASE["ladder"]["small"] == {"hidden": 16, "layers": 1, "heads": 2}  # the base is not mutated


def test_project_params_set_the_slice_radius_only_when_asked():
    assert parse_params(project_params(BASE, "c", "small", 1000, [1], 3.0)).features.landscape_radius == 3.0
    default = project_params(BASE, "c", "small", 10, [1])["features"]["landscape_radius"]
    assert default == BASE["features"]["landscape_radius"]


def test_project_params_refuse_an_unknown_rung_with_one_error_line():
    with pytest.raises(SystemExit, match="error: rung 'huge' is not in params.yaml's ladder"):
        project_params(BASE, "c", "huge", 10, [1])


def test_features_are_the_landscape_and_curvature_vocabulary():
    from topometrics.vocabulary import lookup

    assert len(FEATURES) == 19
    assert {lookup(f).family.name for f in FEATURES} == {"landscape", "curvature"}


def test_paired_equals_scipy_on_matched_seeds():
    with_res = {1: 1.0, 2: 2.0, 3: 4.0, 4: 3.5, 9: 7.0}  # seed 9 has no partner: dropped
    without = {1: 1.5, 2: 3.0, 3: 4.2, 4: 5.0, 5: 0.0}
    r = paired(with_res, without)
    a, b = np.array([1.0, 2.0, 4.0, 3.5]), np.array([1.5, 3.0, 4.2, 5.0])
    d = b - a
    assert r["seeds"] == [1, 2, 3, 4] and r["n"] == 4
    assert r["diff"] == pytest.approx(0.8)  # (0.5 + 1 + 0.2 + 1.5) / 4
    half = stats.t.ppf(0.975, 3) * d.std(ddof=1) / 2
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((0.8 - half, 0.8 + half))
    assert r["p_t"] == pytest.approx(stats.ttest_rel(b, a).pvalue)
    assert r["p_wilcoxon"] == pytest.approx(0.125)  # exact: all 4 differences positive, 2 / 2^4


def test_paired_drops_non_finite_values_and_leaves_undefined_tests_nan():
    r = paired({1: 1.0, 2: math.nan, 3: 2.0}, {1: 1.0, 2: 5.0, 3: 2.0})  # equal pairs: no difference
    assert r["n"] == 2 and r["diff"] == 0.0
    assert math.isnan(r["p_wilcoxon"]) and math.isnan(r["p_t"])
    assert (r["ci_low"], r["ci_high"]) == (0.0, 0.0)
    empty = paired({}, {1: 1.0})
    assert empty["n"] == 0 and math.isnan(empty["diff"]) and math.isnan(empty["ci_low"])
