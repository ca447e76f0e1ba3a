"""topometrics.analysis.stats: Spearman with bootstrap CI, Steiger's test, Bonferroni, t-CIs, power-law fits."""

import numpy as np
import pytest
from scipy import stats as sps

from topometrics.analysis import stats

# --- Spearman and its bootstrap CI ---------------------------------------------------------------


def test_spearman_matches_scipy_and_ci_brackets_rho():
    rng = np.random.default_rng(0)
    x = rng.normal(size=51)
    y = np.round(-x + rng.normal(0, 0.7, 51), 1)  # ties
    r = stats.spearman_bootstrap(x, y, n_boot=1000, seed=3)
    ref = sps.spearmanr(x, y)
    assert (r.rho, r.p_value) == pytest.approx((ref.statistic, ref.pvalue), abs=1e-12)
    assert r.ci_low < r.rho < r.ci_high < 0
    assert r.n == 51 and r.n_boot_valid == 1000


def test_bootstrap_is_deterministic_for_a_seed():
    x, y = np.arange(20.0), np.arange(20.0) ** 0.5 + np.sin(np.arange(20.0))
    a, b = stats.spearman_bootstrap(x, y, 200, seed=1), stats.spearman_bootstrap(x, y, 200, seed=1)
    c = stats.spearman_bootstrap(x, y, 200, seed=2)
    assert (a.ci_low, a.ci_high) == (b.ci_low, b.ci_high)
    assert (a.ci_low, a.ci_high) != (c.ci_low, c.ci_high)


def test_spearman_of_a_constant_series_is_undefined_with_a_reason():
    r = stats.spearman_bootstrap([1, 1, 1, 1], [1, 2, 3, 4])
    assert np.isnan(r.rho) and r.reason == "rho undefined: a constant series"
    r = stats.spearman_bootstrap([1, np.nan, 2], [1, 2, np.nan])
    assert r.n == 1 and r.reason == "rho undefined: 1 finite pairs"


# --- comparing correlations, multiple testing, CIs ----------------------------------------------


def test_steiger_reduces_to_fisher_z_when_the_features_are_uncorrelated():
    # r_bar = 0 and r_xz = 0 make the covariance term vanish: z = (z1 - z2) sqrt((n - 3) / 2)
    z, p = stats.steiger_z(0.3, -0.3, 0.0, 53)
    expected = (np.arctanh(0.3) - np.arctanh(-0.3)) * np.sqrt(50 / 2)
    assert z == pytest.approx(expected)
    assert p == pytest.approx(2 * sps.norm.sf(expected))


def test_steiger_is_antisymmetric_and_zero_for_equal_correlations():
    assert stats.steiger_z(0.8, 0.5, 0.6, 51)[0] == pytest.approx(-stats.steiger_z(0.5, 0.8, 0.6, 51)[0])
    assert stats.steiger_z(0.7, 0.7, 0.4, 51) == pytest.approx((0.0, 1.0))
    # strongly correlated features make the same gap more significant
    assert stats.steiger_z(0.8, 0.6, 0.9, 51)[1] < stats.steiger_z(0.8, 0.6, 0.1, 51)[1]
    with pytest.raises(ValueError, match="n > 3"):
        stats.steiger_z(0.5, 0.4, 0.1, 3)


def test_bonferroni_counts_only_finite_p_values():
    adjusted, significant = stats.bonferroni([0.01, 0.04, np.nan, 0.6], alpha=0.05)
    assert np.allclose(adjusted[[0, 1, 3]], [0.03, 0.12, 1.0]) and np.isnan(adjusted[2])
    assert significant.tolist() == [True, False, False, False]


def test_mean_ci_is_the_student_t_interval():
    v = [0.2, 0.5, 0.3, 0.4]
    mean, lo, hi = stats.mean_ci(v)
    ref = sps.t.interval(0.95, 3, loc=np.mean(v), scale=sps.sem(v))
    assert (mean, lo, hi) == pytest.approx((0.35, *ref))
    assert np.isnan(stats.mean_ci([0.3])[1])


def test_correlation_mean_ci_is_the_t_interval_of_fisher_z_and_stays_in_bounds():
    rhos = [-0.2, -0.9, -0.6]
    z = np.arctanh(rhos)
    ref = sps.t.interval(0.95, 2, loc=z.mean(), scale=sps.sem(z))
    est, lo, hi = stats.correlation_mean_ci(rhos)
    assert (est, lo, hi) == pytest.approx((np.tanh(z.mean()), *np.tanh(ref)))
    assert -1 <= lo < est < hi <= 1 and stats.mean_ci(rhos)[1] < -1  # the plain t-interval leaves [-1, 1]
    est, lo, hi = stats.correlation_mean_ci([-1.0, -1.0])  # perfect correlations: finite, degenerate
    assert est == lo == hi == pytest.approx(-1.0)


# --- power laws in N ----------------------------------------------------------------------------


@pytest.mark.parametrize(("a", "b", "c"), [(3.0, -0.144, 0.5), (0.8, 0.204, 2.0), (-2.0, 0.3, 40.0)])
def test_power_law_fit_recovers_known_parameters_from_noisy_values(a, b, c):
    n = np.array([2936, 7408, 20640, 46368, 97200, 2e5, 5e5, 1e6])
    rng = np.random.default_rng(7)
    clean = stats.power_law(n, a, b, c)
    y = clean * (1 + rng.normal(0, 1e-4, len(n)))
    fit = stats.fit_power_law(n, y)
    assert fit.ok, fit.reason
    assert fit.params["b"] == pytest.approx(b, rel=0.05)
    assert fit.params["a"] == pytest.approx(a, rel=0.1)
    assert fit.params["c"] == pytest.approx(c, abs=0.05 * abs(c) + 0.05)
    assert fit.r2 > 0.999
    assert fit.spearman_rho == pytest.approx(np.sign(a * b))


def test_power_law_fit_failures_are_recorded_not_raised():
    too_few = stats.fit_power_law([1e3, 1e4, 1e5], [3.0, 2.0, 1.5])
    assert (too_few.status, too_few.reason) == ("failed", "need at least 4 rungs for 3 parameters, got 3")
    flat = stats.fit_power_law([1e3, 1e4, 1e5, 1e6], [2.0, 2.0, 2.0, 2.0])
    assert (flat.status, flat.reason) == ("failed", "constant values across rungs")
    jump = stats.fit_power_law([1e3, 2e3, 4e3, 8e3, 1.6e4], [0.0, 0.0, 0.0, 0.0, 1.0])
    assert jump.status == "failed" and "bound" in jump.reason
    with pytest.raises(ValueError, match="parameter counts must be positive"):
        stats.fit_power_law([0, 1, 2, 3], [1, 2, 3, 4])


def test_curve_fit_bounded_reports_non_finite_models():
    params, reason = stats.curve_fit_bounded(
        lambda x, a: np.full_like(x, np.nan), np.arange(5.0), np.arange(5.0), [1.0], ([0], [2])
    )
    assert params is None and reason.startswith("curve_fit did not converge")


# --- partial Spearman and paired comparisons ----------------------------------------------------


def direct_partial(x, y, z):
    """Rank, regress each rank vector on z's ranks with lstsq, correlate the residuals."""
    rx, ry, rz = (sps.rankdata(v) for v in (x, y, z))
    design = np.column_stack([np.ones_like(rz), rz])
    ex = rx - design @ np.linalg.lstsq(design, rx, rcond=None)[0]
    ey = ry - design @ np.linalg.lstsq(design, ry, rcond=None)[0]
    return np.corrcoef(ex, ey)[0, 1]


def test_partial_spearman_equals_rank_residuals_and_the_formula():
    rng = np.random.default_rng(0)
    z = rng.normal(size=60)
    y = np.round(-z + rng.normal(0, 0.8, 60), 1)  # ties
    x = z + rng.normal(0, 0.5, 60) + 0.5 * y
    r = stats.partial_spearman(x, y, z, n_boot=500, seed=1)
    assert r.rho == pytest.approx(direct_partial(x, y, z), abs=1e-12)
    rxy, rxz, ryz = sps.spearmanr(x, y)[0], sps.spearmanr(x, z)[0], sps.spearmanr(y, z)[0]
    assert r.rho == pytest.approx((rxy - rxz * ryz) / np.sqrt((1 - rxz**2) * (1 - ryz**2)), abs=1e-12)
    t = r.rho * np.sqrt(57 / (1 - r.rho**2))
    assert r.p_value == pytest.approx(2 * sps.t.sf(abs(t), 57), rel=1e-9)
    assert r.ci_low < r.rho < r.ci_high and r.n == 60 and r.reason is None


def test_monotone_function_of_the_control_gives_partial_rho_zero():
    rng = np.random.default_rng(1)
    norm = np.sort(rng.uniform(1, 5, 51))  # grows with training
    loss = 3 / norm + rng.normal(0, 0.02, 51)
    r = stats.partial_spearman(np.exp(norm), loss, norm)
    assert r.rho == 0.0 and "monotone function of the control" in r.reason
    assert stats.spearman_bootstrap(np.exp(norm), loss).rho < -0.9  # raw rho is strong
    noisy = stats.partial_spearman(np.exp(norm) + rng.normal(0, 1e-3, 51), loss, norm)
    assert abs(noisy.rho) < 0.3


def test_an_independent_component_is_recovered():
    rng = np.random.default_rng(2)
    norm = np.sort(rng.uniform(1, 5, 200))
    u = rng.normal(size=200)
    loss = -norm + 0.5 * u
    feature = norm**2 + 2.0 * u + rng.normal(0, 0.5, 200)
    r = stats.partial_spearman(feature, loss, norm, n_boot=300)
    assert r.rho > 0.7 and r.ci_low > 0.5
    assert r.rho == pytest.approx(direct_partial(feature, loss, norm), abs=1e-12)


def test_partial_spearman_undefined_cases_carry_reasons():
    z = np.arange(10.0)
    assert "constant" in stats.partial_spearman(np.ones(10), z[::-1], z).reason
    assert "3 finite triples" in stats.partial_spearman([1, 2, 3], [3, 1, 2], [1, 2, 3]).reason
    r = stats.partial_spearman(np.sin(z), -z, z)
    assert np.isnan(r.rho) and "val_loss is a monotone function of the control" in r.reason
