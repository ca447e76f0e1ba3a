"""Tests of topometrics.verdict.decisions against brute force, scipy and numpy."""

import dataclasses
import itertools

import duckdb
import numpy as np
import pandas as pd
import pytest
import scipy.stats
from sklearn.metrics import roc_auc_score

from tests.repo_params import analysis_params
from topometrics.analysis import warehouse
from topometrics.report import verdict
from topometrics.verdict import decisions
from topometrics.verdict.decisions import noise_ceiling, outlier_runs, pair_order_accuracy, robust_z


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


# --- the outlier row --------------------------------------------------------------------------------

PLANTED = {("a", "w", 0), ("b", "x", 1), ("a", "y", 2), ("b", "z", 3)}  # (rung, variant, seed): runs that end far worse
FAMILIES = {"weights_vr": ("vr_tp0",), "weights_np": ("np_norm",)}
PARAMS = analysis_params(permutations=499)  # a Monte Carlo p near its floor (4 outliers: 1 / 8^4), not 1 / 160


def outlier_sweep(seed: int = 2, planted: bool = True, fractions=(0.3, 0.8)) -> pd.DataFrame:
    """64 runs (2 rungs x 4 recipes x 8 seeds) x fractions of verdict inputs with 4 planted outlier runs.

    An outlier's final loss is 0.3 nats (about 15 seed SDs) above its cell's. At fraction 0.3 its loss
    curve still looks good (its last observed loss is below its cell-mates') while ``vr_tp0_level`` already
    marks it (when ``planted``); at 0.8 the loss curve shows it too. ``np_norm`` is noise throughout.
    At the default seed exactly the planted runs are outliers (at others, a Gaussian seed may be one too).
    """
    rng = np.random.default_rng(seed)
    rows = []
    for (ri, rung), (vi, variant), s in itertools.product(enumerate("ab"), enumerate("wxyz"), range(8)):
        bad = (rung, variant, s) in PLANTED
        cell, law, final_noise = 2.0 - 0.2 * ri + 0.05 * vi, -0.3 + rng.normal(0, 0.01), rng.normal(0, 0.02)
        for fraction in fractions:
            seen = 0.3 if bad and fraction >= 0.5 else (-0.05 if bad else rng.normal(0, 0.01))
            anchor = cell - law * (1 - fraction) + seen  # the last observed loss
            row = {"rung": rung, "variant": variant, "seed": s, "fraction": fraction, "n_seen": 10}
            row |= {"actual": cell + law + final_noise + (0.3 if bad else 0.0), "anchor": anchor}
            drop = law * (1 - fraction)  # what the loss curve extrapolates: the normal remaining drop
            row |= {c: drop + rng.normal(0, 0.005) for c in ("loss_drop", "mpl_drop", "tissue_drop")}
            row |= {"weight_norm_level": rng.normal(), "weight_norm_rate": rng.normal()}
            row |= {"vr_tp0_level": float(bad and planted) + rng.normal(0, 0.1), "vr_tp0_rate": rng.normal()}
            row |= {"np_norm_level": rng.normal(), "np_norm_rate": rng.normal()}
            rows.append(row)
    return pd.DataFrame(rows)


def test_within_cell_auroc_is_sklearns_auroc_in_one_cell_and_the_pair_weighted_mean_over_cells():
    rng = np.random.default_rng(3)
    score = np.round(rng.normal(size=30), 1)  # rounded: ties, which count one half in both
    outlier = np.zeros(30, bool)
    outlier[[0, 1, 12, 20, 21, 22]] = True
    cells = np.repeat(["p", "q", "r"], 10)
    one = cells == "p"
    assert decisions.within_cell_auroc(score[one], outlier[one], cells[one]) == pytest.approx(
        roc_auc_score(outlier[one], score[one])
    )
    u = scipy.stats.mannwhitneyu(score[one & outlier], score[one & ~outlier]).statistic
    assert decisions.within_cell_auroc(score[one], outlier[one], cells[one]) == pytest.approx(u / (2 * 8))
    weights = {c: (outlier & (cells == c)).sum() * (~outlier & (cells == c)).sum() for c in "pqr"}
    expected = sum(weights[c] * roc_auc_score(outlier[cells == c], score[cells == c]) for c in "pqr")
    assert decisions.within_cell_auroc(score, outlier, cells) == pytest.approx(expected / sum(weights.values()))
    shifted = score + np.where(cells == "q", 100.0, 0.0)  # only pairs within a cell count
    assert decisions.within_cell_auroc(shifted, outlier, cells) == decisions.within_cell_auroc(score, outlier, cells)
    assert np.isnan(decisions.within_cell_auroc(score, np.zeros(30, bool), cells))  # no outlier: no pair


def test_auroc_bounds_are_the_cells_bootstrap_and_need_two_cells():
    outlier, cells = np.array([1, 0, 0, 1, 0, 0], bool), np.repeat(["p", "q"], 3)
    same = np.arange(6.0)
    assert decisions.auroc_bounds(same, same, outlier, cells) == (0.0, 0.0)  # the same score: no gain anywhere
    flipped = np.where(outlier, 10.0, 0.0)
    low, high = decisions.auroc_bounds(-flipped, flipped, outlier, cells)
    assert low == high == 1.0  # every cell goes from AUROC 0 to 1
    assert all(np.isnan(decisions.auroc_bounds(same[:3], same[:3], outlier[:3], cells[:3])))


def test_the_shuffle_floor_is_the_brute_force_chance_that_each_cells_outliers_keep_their_rows():
    outlier = np.array([1, 1, 0, 0, 1, 0, 0, 0, 0], bool)
    cells = np.array(["p"] * 4 + ["q"] * 3 + ["r"] * 2)
    kept = 0
    perms = list(itertools.product(itertools.permutations(range(4)), itertools.permutations(range(4, 7))))
    for first, second in perms:
        index = np.array([*first, *second, 7, 8])
        kept += set(index[outlier]) == set(np.flatnonzero(outlier))
    assert decisions.shuffle_floor(outlier, cells) == pytest.approx(kept / len(perms)) == pytest.approx(1 / 18)
    rng = np.random.default_rng(0)
    index = decisions.within_cell_permutation(cells, rng)
    assert (cells[index] == cells).all() and sorted(index) == list(range(9))  # rows move only within their cell


def test_a_gaussian_cell_flags_few_runs_at_the_default_threshold():
    rng = np.random.default_rng(0)
    loss, cells = rng.normal(size=8 * 400), np.repeat(np.arange(400), 8)  # the sweep's 8 seeds per cell
    share = outlier_runs(loss, cells, analysis_params().outlier_sd).mean()
    assert 0.005 < share < 0.025  # about 1.6 %; the leave-one-out MAD of 7 runs has heavy tails (3 SDs: 4.9 %)


def test_a_family_that_marks_the_outlier_runs_early_is_flagged_before_the_loss_curve_catches_up():
    rows = decisions.outlier_verdict(outlier_sweep(), PARAMS, FAMILIES).set_index(["fraction", "family"])
    early, late = rows.loc[(0.3, "weights_vr")], rows.loc[(0.8, "weights_vr")]
    assert early["n_outliers"] == 4 and early["n"] == 64 and early["role"] == "outlier" and early["cv"] == "seed"
    assert early["auroc_without"] < 0.2 and early["auroc_with"] == 1.0 and early["verdict"] == "adds"
    assert early["auroc_low"] > 0 and early["statistic"] == early["auroc_with"] - early["auroc_without"]
    assert late["auroc_without"] == 1.0 and late["verdict"] == "no evidence"  # the loss curve sees them by now
    assert rows.loc[(0.3, "weights_np"), "verdict"] == "no evidence"
    ok = rows[rows["status"] == "ok"]
    holm = decisions.inference.holm(ok["p_value"].to_numpy())
    np.testing.assert_allclose(ok["p_adjusted"].to_numpy(), holm)  # Holm over the outlier rows only


def one_refit_at_a_time(base, extra, target, anchor, flagged, labels, refits):
    """The outlier test's p and refits done, each refit fitted alone in the order of its draws (the reference the
    stacked refits must equal)."""
    inference = decisions.inference
    folds = inference.base_folds(base, target, labels.groups)
    paired = np.isfinite(folds.without)
    flag = flagged & paired

    def auroc(pred):
        return decisions.within_cell_auroc(np.where(paired, anchor + pred, np.nan), flag, labels.cells)

    before = auroc(folds.without)
    observed = auroc(inference.with_family(folds, extra, labels.groups)) - before
    rng, hits, done = np.random.default_rng(refits.seed), 0, 0
    while done < refits.n_perm:
        moved = extra[decisions.within_cell_permutation(labels.cells, rng)]
        hits += auroc(inference.with_family(folds, moved, labels.groups)) - before >= observed - 1e-12
        done += 1
        if refits.stop and hits >= refits.stop:
            return hits / done, done
    return (1 + hits) / (1 + done), done


@pytest.mark.parametrize("family", ["vr_tp0", "np_norm"])  # the planted family (every refit), noise (an early stop)
def test_the_outlier_tests_refits_in_stacks_give_the_p_of_one_refit_at_a_time(family):
    g = outlier_sweep(fractions=(0.3,))
    cells = (g["rung"] + "/" + g["variant"]).to_numpy()
    flagged = outlier_runs(g["actual"].to_numpy(), cells)
    labels = decisions.inference.RunLabels(g["seed"].to_numpy(), g["rung"].to_numpy(), cells, g["seed"].to_numpy())
    base = g[["loss_drop", "weight_norm_level", "weight_norm_rate"]].to_numpy()
    extra = g[[f"{family}_level", f"{family}_rate"]].to_numpy()
    target, anchor = (g["actual"] - g["anchor"]).to_numpy(), g["anchor"].to_numpy()
    refits = decisions.inference.Refits(199, 5, stop=10)
    test = decisions.outlier_test(base, extra, target, anchor, flagged, labels, refits, n_boot=10)
    p, done = one_refit_at_a_time(base, extra, target, anchor, flagged, labels, refits)
    assert (test.p_value, test.n_perm) == (p, done)
    assert done == 199 if family == "vr_tp0" else done < 100


def test_a_noise_family_is_not_flagged_beyond_its_nominal_rate():
    params = analysis_params()
    p = [
        decisions.outlier_verdict(outlier_sweep(seed, fractions=(0.3,)), params, {"weights_np": ("np_norm",)})
        for seed in range(10, 16)
    ]
    p_values = np.array([float(r["p_value"].iloc[0]) for r in p])
    assert np.isfinite(p_values).all()
    assert (p_values < params.alpha).sum() <= 1  # nominal 5 %: at most one of 6 (binomial P(> 1) = 3 %)
    assert not any((r["verdict"] == "adds").any() for r in p)


def test_identical_losses_have_no_outlier_and_too_few_outliers_is_one_reason_in_words():
    sweep = outlier_sweep(fractions=(0.3,))
    flat = sweep.assign(actual=1.5)  # every cell's losses identical: no spread to measure an outlier by
    assert not outlier_runs(flat["actual"], decisions._cell_labels(flat)).any()
    row = decisions.outlier_verdict(flat, analysis_params(), FAMILIES).iloc[0]
    assert row["status"] == "skipped" and row["n_outliers"] == 0
    no_spread = "skipped: no cell has 4 runs whose final losses spread (a run's robust z needs 3 other seeds)"
    assert row["verdict"] == no_spread
    assert (
        decisions.outlier_verdict(sweep[sweep["seed"] < 3], analysis_params(), FAMILIES).iloc[0]["verdict"] == no_spread
    )
    even = sweep.assign(actual=1.5 + 0.01 * sweep["seed"])  # evenly spread seeds: the worst is 1.35 robust SDs out
    row = decisions.outlier_verdict(even, analysis_params(), FAMILIES).iloc[0]
    assert (
        row["verdict"]
        == "skipped: no outlier runs (final loss > 5 robust SDs above its cell's others) among 64; need 2"
    )
    keys = zip(sweep["rung"], sweep["variant"], sweep["seed"], strict=True)
    one = sweep[[k not in PLANTED - {("b", "x", 1)} for k in keys]]  # three of the four planted runs gone
    row = decisions.outlier_verdict(one, analysis_params(), FAMILIES).iloc[0]
    assert row["verdict"].startswith("skipped: 1 outlier run (") and row["n_outliers"] == 1


def test_the_outlier_rows_reach_the_topology_verdict_view_and_the_report_table():
    rows = decisions.outlier_verdict(outlier_sweep(fractions=(0.3,)), analysis_params(), FAMILIES)
    con = duckdb.connect()
    schema, *views = warehouse.sql_files()
    con.execute(schema.read_text())
    settings = list(dataclasses.asdict(analysis_params().settings()).values())
    con.execute(f"INSERT INTO settings VALUES ({', '.join('?' * len(settings))})", settings)
    con.register("frame", rows)
    con.execute("INSERT INTO incremental_validity BY NAME SELECT * FROM frame")
    for view in views:
        con.execute(view.read_text())
    view = con.execute("SELECT * FROM topology_verdict WHERE role = 'outlier' ORDER BY family").df()
    assert list(view["family"]) == ["weights_np", "weights_vr"] and view["mae_without"].isna().all()
    assert list(view["verdict"]) == list(rows.sort_values("family")["verdict"])
    table = verdict.verdict_table(view)
    reads = dict(zip(table["family"], table["reads as"], strict=True))
    assert reads["weights_vr"].startswith(
        "At 30% of training, the within-cell AUROC of the predicted final loss for the outlier runs is "
    )
    assert "4 outlier runs among n=64 in 8 cells, leave-one-seed-out" in reads["weights_vr"]
    assert reads["weights_vr"].endswith(f": {view['verdict'].iloc[1]}.") and table["auroc_with"].notna().all()
