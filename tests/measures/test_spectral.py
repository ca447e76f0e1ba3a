"""Tests of topometrics.measures.spectral against definitions and numpy."""

from __future__ import annotations

import numpy as np
import pytest

from topometrics.measures.spectral import (
    covariance_spectrum,
    participation_ratio,
    rankme,
    singular_values,
    weight_spectrum,
)


def test_rankme_of_an_isotropic_cloud_is_about_its_dimension():
    x = np.random.default_rng(0).standard_normal((20000, 10))
    assert covariance_spectrum(x)["rankme"] == pytest.approx(10, rel=0.01)
    assert covariance_spectrum(x)["pr"] == pytest.approx(10, rel=0.02)


def test_rankme_and_pr_of_a_rank_one_cloud_are_one():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((500, 1)) @ rng.standard_normal((1, 8)) + 5.0
    spectrum = covariance_spectrum(x)
    assert spectrum["rankme"] == pytest.approx(1.0, abs=1e-6)
    assert spectrum["pr"] == pytest.approx(1.0, abs=1e-9)


def test_rankme_by_hand():
    assert rankme([1.0, 1.0, 1.0, 0.0]) == pytest.approx(3.0)
    p = np.array([3.0, 1.0]) / 4
    assert rankme([3.0, 1.0]) == pytest.approx(np.exp(-(p * np.log(p)).sum()))
    with pytest.raises(ValueError, match="non-negative"):
        rankme([-1.0])


def test_participation_ratio_matches_numpy_covariance():
    x = np.random.default_rng(2).standard_normal((300, 6)) * np.arange(1, 7)
    lam = np.linalg.eigvalsh(np.cov(x, rowvar=False))
    assert covariance_spectrum(x)["pr"] == pytest.approx(lam.sum() ** 2 / (lam**2).sum())
    assert participation_ratio(lam) == pytest.approx(lam.sum() ** 2 / (lam**2).sum())


def test_weight_spectrum_norms_match_numpy():
    w = np.random.default_rng(3).standard_normal((12, 7))
    spectrum = weight_spectrum(w)
    assert spectrum["fro"] == pytest.approx(np.linalg.norm(w, "fro"))
    assert spectrum["spec"] == pytest.approx(np.linalg.norm(w, 2))
    s2 = np.linalg.eigvalsh(w @ w.T)
    assert spectrum["pr"] == pytest.approx(s2.sum() ** 2 / (s2**2).sum())


def test_degenerate_inputs_give_zero_not_nan():
    assert covariance_spectrum(np.ones((5, 3))) == {"rankme": 0.0, "pr": 0.0}
    assert weight_spectrum(np.zeros((2, 2)))["rankme"] == 0.0
    assert covariance_spectrum(np.ones((1, 3)))["pr"] == 0.0


@pytest.mark.parametrize("shape", [(300, 40), (40, 300), (128, 128), (1, 9), (9, 1)])
def test_singular_values_equal_numpys_svd(shape):
    w = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    expected = np.linalg.svd(w.astype(np.float64), compute_uv=False)
    got = singular_values(w)
    assert got.shape == expected.shape and np.all(np.diff(got) <= 0)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12 * expected[0])


def test_singular_values_of_rank_deficient_and_zero_matrices_are_exact_zeros():
    rng = np.random.default_rng(0)
    low = rng.standard_normal((50, 3)) @ rng.standard_normal((3, 20))  # rank 3
    s = singular_values(low)
    np.testing.assert_allclose(s[:3], np.linalg.svd(low, compute_uv=False)[:3], rtol=1e-10)
    assert np.all(s[3:] == 0.0)
    assert np.all(singular_values(np.zeros((4, 6))) == 0.0) and singular_values(np.zeros((4, 6))).shape == (4,)
