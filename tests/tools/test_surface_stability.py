"""tools/surface_stability.py: the comparison statistics (relative differences, identical share, Spearman's rho
from scipy) on hand-worked values, and the table's rows over checkpoints where only some have a setting."""

import numpy as np
import pytest
from scipy.stats import spearmanr

from tools.surface_stability import comparisons, statistics


def test_statistics_are_the_relative_differences_the_identical_share_and_spearmans_rho():
    ref, other = [1.0, 2.0, 4.0, 0.0, 8.0], [1.0, 3.0, 2.0, 0.0, 8.0]
    found = statistics(ref, other)
    rel = [0.0, 0.5, 0.5, 0.0, 0.0]  # 0 against 0 is no difference
    assert found["median_rel"] == pytest.approx(np.median(rel)) and found["max_rel"] == pytest.approx(0.5)
    assert found["equal"] == pytest.approx(3 / 5) and found["n"] == 5
    assert found["spearman"] == pytest.approx(spearmanr(ref, other).statistic)


def test_non_finite_values_are_left_out_and_a_constant_column_has_no_rho():
    found = statistics([1.0, np.nan, 2.0, 3.0], [1.0, 5.0, np.inf, 3.0])
    assert found["n"] == 2 and found["median_rel"] == 0.0 and np.isnan(found["spearman"])


def test_the_hess_rows_use_only_the_checkpoints_whose_reference_slice_exists():
    slice_ = {"minima": 1.0}
    curv = {"eig1": 2.0}
    with_hess = {
        "curvature ref": curv,
        "curvature 10 steps": curv,
        "trace": {"probes 4": 1, "probes 8": 1, "probes 32": 1},
    }
    with_hess |= {"hess grid 15": slice_, "hess grid 13": {"minima": 2.0}}
    without = {k: v for k, v in with_hess.items() if not k.startswith("hess")}
    rows = {(key, setting): s for key, setting, _, s in comparisons([with_hess, without])}
    assert rows[("minima", "hess grid 13")]["n"] == 1 and rows[("minima", "hess grid 13")]["max_rel"] == 1.0
    assert rows[("eig1", "curvature 10 steps")]["n"] == 2
