"""Tests of topometrics.measures.heavy_tail: known power laws, the powerlaw package, NULL rules, invariance."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from topometrics.measures import heavy_tail as H
from topometrics.measures.spectral import singular_values


def weight_alpha(weight):
    """alpha of a weight matrix's eigenvalues of ``W^T W``, as the features stage fits ``w_alpha`` (layer_features)."""
    return H.fit_tail(singular_values(weight) ** 2)


def pareto_sample(alpha, n, xmin, seed):
    """Inverse-CDF draws of p(x) ~ x^(-alpha), x >= xmin."""
    return xmin * (1 - np.random.default_rng(seed).random(n)) ** (-1 / (alpha - 1))


@pytest.mark.parametrize("alpha", [1.8, 2.5, 3.5, 5.0])
def test_alpha_of_a_known_power_law_is_recovered(alpha):
    fit = H.fit_tail(pareto_sample(alpha, 4000, 2.0, 0))
    assert fit.reason is None
    assert abs(fit.alpha - alpha) < 4 * (alpha - 1) / np.sqrt(fit.n_tail)
    assert fit.xmin == pytest.approx(2.0, rel=0.5)


def test_a_power_law_tail_above_a_uniform_body_is_found():
    body = np.random.default_rng(1).uniform(0.1, 1.0, 2000)
    fit = H.fit_tail(np.r_[body, pareto_sample(3.0, 2000, 1.0, 2)])
    assert fit.xmin >= 0.9 and abs(fit.alpha - 3.0) < 0.3


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_alpha_at_the_chosen_xmin_equals_the_powerlaw_package(seed):
    powerlaw = pytest.importorskip("powerlaw")
    x = pareto_sample(2.3, 800, 1.0, seed) * np.random.default_rng(seed + 10).uniform(0.9, 1.0, 800)
    fit = H.fit_tail(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = powerlaw.Fit(x, xmin=fit.xmin, verbose=0).power_law
    assert fit.alpha == pytest.approx(ref.alpha, abs=1e-9)
    # powerlaw's D compares the CDFs only after each step; the KS sup here takes both sides
    # of every step, so it is at least powerlaw's and at most one step (1/n_tail) above it
    assert ref.D - 1e-12 <= fit.ks <= ref.D + 1 / fit.n_tail


def test_too_few_eigenvalues_give_null_with_a_reason():
    fit = weight_alpha(np.random.default_rng(0).standard_normal((32, 8)))
    assert np.isnan(fit.alpha) and "8 positive eigenvalues" in fit.reason
    fit = H.fit_tail(np.ones(40))
    assert np.isnan(fit.alpha) and fit.reason
    assert H.fit_tail([np.nan] * 30).reason == "non-finite eigenvalues"
    # rank-deficient: zero eigenvalues are not part of the density
    w = np.random.default_rng(1).standard_normal((30, 10)) @ np.random.default_rng(2).standard_normal((10, 40))
    assert "10 positive eigenvalues" in weight_alpha(w).reason


def test_tail_has_at_least_min_tail_values():
    fit = H.fit_tail(pareto_sample(2.5, 30, 1.0, 3))
    assert fit.n_tail >= H.MIN_TAIL


@pytest.mark.parametrize("c", [1e-3, 0.5, 3.0, 1e3])
def test_weight_alpha_is_invariant_to_scale_and_row_permutation(c):
    rng = np.random.default_rng(4)
    w = rng.standard_t(3, size=(96, 48))
    base = weight_alpha(w)
    moved = weight_alpha(c * w[rng.permutation(96)])
    assert base.reason is None
    assert moved.alpha == pytest.approx(base.alpha, abs=1e-9)
    assert moved.n_tail == base.n_tail


def test_covariance_alpha_is_invariant_to_scale_and_translation():
    states = np.random.default_rng(5).standard_t(2.5, size=(400, 40))
    base = H.covariance_alpha(states)
    assert base.reason is None
    assert H.covariance_alpha(3.0 * states + 7.0).alpha == pytest.approx(base.alpha, abs=1e-9)
