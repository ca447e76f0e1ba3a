"""Tests of topometrics.measures.representation: the hidden-state cloud's topology."""

from __future__ import annotations

import numpy as np
import pytest

from topometrics.measures.persistence import diagram_summary, vietoris_rips_diagrams
from topometrics.measures.representation import betti_scales, pca_project, representation_topology


def test_degenerate_clouds_give_finite_documented_values():
    for cloud in (np.ones((10, 3)), np.ones((1, 3))):
        features, _ = representation_topology(cloud, 500, 50, 0, 0.1, 4)
        assert all(np.isfinite(v) for v in features.values())
        assert features["betti0_00"] == 1 and features["betti1_03"] == 0
        assert features["diameter"] == 0 and features["tp0"] == 0


def test_full_rank_pca_is_a_rigid_motion_so_the_diagrams_are_the_clouds():
    x = np.random.default_rng(0).standard_normal((60, 5))
    features, dgms = representation_topology(x, 500, 50, 0, 0.1, 4)
    expected = vietoris_rips_diagrams(x)
    for got, want in zip(dgms, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-9)  # H1 through ripser's float32
    assert features["tp0"] == pytest.approx(diagram_summary(expected)["tp0"], rel=1e-9)
    assert features["diameter"] == pytest.approx(pdist_max(x), rel=1e-12)
    assert pca_project(x, 2).shape == (60, 2)


def test_betti_curves_count_bars_alive_at_evenly_spaced_scales_up_to_the_diameter():
    x = np.array([[0.0], [1.0], [3.0]])  # H0 deaths 1 and 2, plus the essential bar
    features, _ = representation_topology(x, 500, 50, 0, 0.1, 3)
    np.testing.assert_array_equal(betti_scales(x, 3), [0.0, 1.5, 3.0])
    assert [features[f"betti0_{i:02d}"] for i in range(3)] == [3, 2, 1]


def pdist_max(x: np.ndarray) -> float:
    diffs = x[:, None, :] - x[None, :, :]
    return float(np.sqrt((diffs**2).sum(-1)).max())
