"""Tests of topometrics.analysis.decisions against brute force, scipy and numpy."""

import itertools

import numpy as np
import pytest
import scipy.stats

from topometrics.analysis.decisions import noise_ceiling, outlier_runs, pair_order_accuracy, robust_z


def brute_force_accuracy(predicted, final, within=None) -> float:
    """The documented rule as a double loop: final ties skipped, predicted ties worth one half."""
    score, n = 0.0, 0
    for i, j in itertools.combinations(range(len(final)), 2):
        values = (predicted[i], predicted[j], final[i], final[j])
        if not all(np.isfinite(values)) or final[i] == final[j]:
            continue
        if within is not None and within[i] != within[j]:
            continue
        n += 1
        if predicted[i] == predicted[j]:
            score += 0.5
        elif (predicted[i] < predicted[j]) == (final[i] < final[j]):
            score += 1
    return score / n if n else float("nan")


def test_pair_order_accuracy_is_the_brute_force_share_with_ties_and_missing_values():
    rng = np.random.default_rng(3)
    for _ in range(20):
        final = np.round(rng.normal(size=15), 1)  # rounded: ties in the final loss
        predicted = np.round(final + rng.normal(scale=0.5, size=15), 1)  # and in the prediction
        predicted[rng.integers(15)] = np.nan
        groups = rng.integers(3, size=15)
        assert pair_order_accuracy(predicted, final) == pytest.approx(brute_force_accuracy(predicted, final))
        assert pair_order_accuracy(predicted, final, within=groups) == pytest.approx(
            brute_force_accuracy(predicted, final, groups)
        )


def test_without_ties_the_accuracy_is_one_plus_kendalls_tau_over_two():
    rng = np.random.default_rng(4)
    final = rng.normal(size=30)
    predicted = final + rng.normal(scale=0.7, size=30)
    tau = scipy.stats.kendalltau(predicted, final).statistic
    assert pair_order_accuracy(predicted, final) == pytest.approx((1 + tau) / 2, abs=1e-12)


def test_pair_order_accuracy_known_cases():
    final = np.array([1.0, 2.0, 3.0, 4.0])
    assert pair_order_accuracy(final * 10, final) == 1.0  # only the order counts
    assert pair_order_accuracy(-final, final) == 0.0
    assert pair_order_accuracy(np.zeros(4), final) == 0.5  # a constant predictor is a coin flip
    assert pair_order_accuracy([1.0, 3.0, 2.0, 4.0], final) == pytest.approx(5 / 6)  # one of six pairs swapped
    assert np.isnan(pair_order_accuracy([1.0, 2.0], [5.0, 5.0]))  # no pair has a right order
    assert np.isnan(pair_order_accuracy(final, final, within=["a", "b", "c", "d"]))
    with pytest.raises(ValueError, match="one length"):
        pair_order_accuracy([1.0], final)


def test_noise_ceiling_is_the_anova_within_cell_root_mean_square():
    rng = np.random.default_rng(5)
    cells = np.repeat(["tiny|base", "tiny|wsd", "small|base", "small|wsd"], [8, 8, 7, 1])
    loss = rng.normal(size=len(cells)) * 0.05 + np.unique(cells, return_inverse=True)[1]
    # least squares on one indicator per cell: residual sum of squares over n - number of cells
    dummies = (cells[:, None] == np.unique(cells)[None, :]).astype(float)
    residual = loss - dummies @ np.linalg.lstsq(dummies, loss, rcond=None)[0]
    expected = np.sqrt((residual**2).sum() / (len(loss) - 4))
    assert noise_ceiling(loss, cells) == pytest.approx(expected, rel=1e-12)
    # and scipy's one-way ANOVA: F = between mean square / within mean square
    groups = [loss[cells == c] for c in np.unique(cells) if (cells == c).sum() > 1]
    f = scipy.stats.f_oneway(*groups).statistic
    grand = np.concatenate(groups).mean()
    between = sum(len(g) * (g.mean() - grand) ** 2 for g in groups) / (len(groups) - 1)
    assert noise_ceiling(loss, cells) ** 2 == pytest.approx(between / f, rel=1e-9)


def test_noise_ceiling_of_one_cell_is_its_sample_sd_and_skips_missing_losses():
    assert noise_ceiling([1.0, 2.0, 3.0, np.nan], ["a"] * 4) == pytest.approx(np.std([1.0, 2.0, 3.0], ddof=1))
    assert np.isnan(noise_ceiling([1.0, 2.0], ["a", "b"]))  # no cell with two runs


def test_an_outlier_seed_is_flagged_against_its_own_cells_others():
    rng = np.random.default_rng(6)
    cells = np.repeat(["tiny|base", "small|base"], 8)
    loss = np.where(cells == "tiny|base", 2.0, 1.5) + rng.normal(scale=0.01, size=16)
    loss[3] += 0.2  # one tiny seed ends 20 SDs worse
    loss[12] -= 0.2  # one small seed ends far better: not an outlier run (one-sided)
    flagged = outlier_runs(loss, cells, k=3.0)
    assert flagged.tolist() == [i == 3 for i in range(16)]
    z = robust_z(loss, cells)
    others = np.delete(loss[:8], 3)
    expected = (loss[3] - np.median(others)) / (1.4826 * np.median(np.abs(others - np.median(others))))
    assert z[3] == pytest.approx(expected) and z[12] < -3


def test_too_few_or_identical_others_flag_nothing():
    assert np.isnan(robust_z([1.0, 2.0, 9.0], ["a"] * 3)).all()  # two others per run
    assert not outlier_runs([1.0, 1.0, 1.0, 9.0], ["a"] * 4).any()  # others without spread: no scale
    with pytest.raises(ValueError, match="positive"):
        outlier_runs([1.0], ["a"], k=0)
