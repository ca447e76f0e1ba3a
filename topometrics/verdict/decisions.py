"""Decisions and the noise ceiling: numbers that put a final-loss predictor on the scale a user meets.

- :func:`pair_order_accuracy`: the share of run pairs a predictor orders as their final losses are
  ordered ("which of two runs ends better?"; DataDecide, 2025, reports about 80 % for ranking by the
  current loss).
- :func:`noise_ceiling`: the pooled within-cell (rung x recipe) standard deviation of the final loss,
  the seed-to-seed spread no predictor from a run's recipe can beat.
- :func:`robust_z` and :func:`outlier_runs`: runs that end far worse than the other seeds of their cell.
- :func:`outlier_verdict`: does a topological family flag those outlier runs, at a fraction of training,
  better than the loss curve + weight norm does? (:func:`within_cell_auroc` of the out-of-fold
  predicted final loss with and without the family, :func:`outlier_test` for its p and bounds.)

Pure functions of arrays (one entry per run, NaN for a run with no number), and one of a DataFrame.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from topometrics.params import AnalysisParams
from topometrics.verdict import inference, verdict
from topometrics.vocabulary import verdict_families

MAD_TO_SD = 1.4826  # the median absolute deviation times this estimates the SD of a normal sample


def pair_order_accuracy(predicted, final, within=None) -> float:
    """Share of run pairs whose order by ``predicted`` is their order by ``final`` loss.

    Parameters
    ----------
    predicted, final : array_like, shape (n_runs,)
        A predictor's value per run (any scale; only the order counts) and the final loss.
    within : array_like, shape (n_runs,), optional
        Group labels (e.g. the rung): only pairs of the same group count. None: every pair.

    Ties: a pair tied in ``final`` has no right order and is not counted; a pair the predictor ties
    counts one half (a coin flip). A pair with a non-finite value in either array is not counted.
    Without ties the share is (1 + tau) / 2, tau = Kendall's rank correlation of the two arrays.

    Returns a float in [0, 1]; NaN when no pair is counted.
    """
    p, f = np.asarray(predicted, dtype=float), np.asarray(final, dtype=float)
    if p.shape != f.shape or p.ndim != 1:
        raise ValueError(f"predicted and final must be 1-D arrays of one length, got {p.shape} and {f.shape}")
    ok = np.isfinite(p) & np.isfinite(f)
    counted = np.triu(ok[:, None] & ok[None, :], k=1)  # each unordered pair once
    if within is not None:
        groups = np.asarray(within)
        counted &= groups[:, None] == groups[None, :]
    with np.errstate(invalid="ignore"):
        sign_f = np.sign(f[:, None] - f[None, :])
        sign_p = np.sign(p[:, None] - p[None, :])
    counted &= sign_f != 0
    if not counted.any():
        return float("nan")
    score = np.where(sign_p == 0, 0.5, (sign_p == sign_f).astype(float))
    return float(score[counted].mean())


def noise_ceiling(final_loss, cells) -> float:
    """Pooled within-cell standard deviation of the final loss.

    sqrt( sum over cells of sum_i (x_i - mean of the cell)^2 / sum over cells of (n_cell - 1) ): the
    one-way ANOVA's within-group root mean square, so every cell's seeds count in proportion to their
    degrees of freedom. Non-finite losses are left out; a cell of one run adds no degree of freedom.

    Parameters
    ----------
    final_loss : array_like, shape (n_runs,)
        Final validation loss per run (nats).
    cells : array_like, shape (n_runs,)
        The run's cell label (e.g. ``"small|wsd"``): runs that differ only by seed share a cell.

    Returns
    -------
    float
        In nats; NaN when no cell has two runs.
    """
    x, labels = _finite_by_cell(final_loss, cells)
    squares, dof = 0.0, 0
    for label in np.unique(labels):
        values = x[labels == label]
        squares += float(((values - values.mean()) ** 2).sum())
        dof += len(values) - 1
    return float(np.sqrt(squares / dof)) if dof > 0 else float("nan")


def robust_z(final_loss, cells) -> np.ndarray:
    """How far each run's final loss lies above the other runs of its cell, in robust SDs.

    (x_i - median of the others) / (1.4826 x their median absolute deviation): the run itself is left
    out, so an outlier does not widen its own yardstick. NaN with fewer than 3 other finite runs in
    the cell, or when the others' deviation is 0 (no scale to measure by).

    Returns
    -------
    ndarray, shape (n_runs,)
        Positive = worse (higher loss) than the cell's others.
    """
    x, labels = _checked(final_loss, cells)
    z = np.full(x.shape, np.nan)
    for i in np.flatnonzero(np.isfinite(x)):
        others = x[(labels == labels[i]) & np.isfinite(x) & (np.arange(len(x)) != i)]
        if len(others) < 3:
            continue
        centre = np.median(others)
        scale = MAD_TO_SD * np.median(np.abs(others - centre))
        if scale > 0:
            z[i] = (x[i] - centre) / scale
    return z


def outlier_runs(final_loss, cells, k: float = 3.0) -> np.ndarray:
    """Runs whose final loss is more than ``k`` robust SDs worse than their cell's others (:func:`robust_z`).

    Returns
    -------
    ndarray of bool, shape (n_runs,)
        False where :func:`robust_z` is NaN (too few others, or no spread among them).
    """
    if not k > 0:
        raise ValueError(f"k must be a positive number of robust SDs, got {k}")
    z = robust_z(final_loss, cells)
    return np.nan_to_num(z, nan=-np.inf) > k


def _checked(values, cells) -> tuple[np.ndarray, np.ndarray]:
    """The losses as floats and the cell labels, refused unless both are 1-D of one length."""
    x, labels = np.asarray(values, dtype=float), np.asarray(cells)
    if x.shape != labels.shape or x.ndim != 1:
        raise ValueError(f"final_loss and cells must be 1-D arrays of one length, got {x.shape} and {labels.shape}")
    return x, labels


def _finite_by_cell(values, cells) -> tuple[np.ndarray, np.ndarray]:
    x, labels = _checked(values, cells)
    keep = np.isfinite(x)
    return x[keep], labels[keep]


# --- the outlier row of the verdict ----------------------------------------------------------------

OUTLIER_SCHEME = "seed"  # leave-one-seed-out: an outlier's cell-mates (the other seeds) train its fold
MIN_OUTLIERS = 2  # outlier runs a row needs (on one, the within-cell AUROC moves in steps of 1 / cell-mates)
OUTLIER_ROLE = "outlier"  # Holm-corrected among themselves, never with the 'topology' rows


def within_cell_auroc(score, outlier, cells) -> float:
    """Share of (outlier, other run) pairs of one cell in which the outlier has the higher ``score``.

    Only pairs within a cell count (an outlier is "worse than its cell's others", so a score is judged on
    whether it ranks the outlier above its cell-mates, not above runs of a worse recipe); a tie counts one
    half; a run with a non-finite score is left out. In one cell this is sklearn's ``roc_auc_score``
    (= Mann-Whitney U / (n_outliers n_others)); over several, the pair-weighted mean of the cells' AUROCs.

    Parameters
    ----------
    score : array_like, shape (n_runs,)
        Higher = more likely an outlier (e.g. the predicted final loss).
    outlier : array_like of bool, shape (n_runs,)
    cells : array_like, shape (n_runs,)

    Returns
    -------
    float
        In [0, 1] (0.5: no better than chance); NaN when no cell has both an outlier and another run.
    """
    wins, pairs = _cell_pairs(score, outlier, cells)
    return float(wins.sum() / pairs.sum()) if pairs.sum() > 0 else float("nan")


def _cell_pairs(score, outlier, cells) -> tuple[np.ndarray, np.ndarray]:
    """Per cell with both kinds of run: the outlier's wins (ties one half) and the number of pairs."""
    s, flag, labels = np.asarray(score, float), np.asarray(outlier, bool), np.asarray(cells)
    keep = np.isfinite(s)
    wins, pairs = [], []
    for label in np.unique(labels[keep]):
        here = keep & (labels == label)
        pos, neg = s[here & flag], s[here & ~flag]
        if len(pos) and len(neg):
            diff = pos[:, None] - neg[None, :]
            wins.append(float((diff > 0).sum() + 0.5 * (diff == 0).sum()))
            pairs.append(diff.size)
    return np.array(wins, float), np.array(pairs, float)


def auroc_bounds(without, with_, outlier, cells, n_boot: int = 1000, seed: int = 0, level: float = 0.95):
    """One-sided ``level`` lower and upper bounds on within-cell AUROC(with) - AUROC(without), cells as units.

    A percentile bootstrap over the cells that hold an outlier and another run (the only cells with pairs):
    each resample draws that many cells with replacement and recomputes both pooled AUROCs. NaN bounds with
    fewer than 2 such cells. Both scores must be finite on the same runs.
    """
    wins_wo, pairs = _cell_pairs(without, outlier, cells)
    wins_w, _ = _cell_pairs(with_, outlier, cells)
    if len(pairs) < 2:
        return float("nan"), float("nan")
    draw = np.random.default_rng(seed).integers(0, len(pairs), size=(n_boot, len(pairs)))
    delta = (wins_w[draw].sum(axis=1) - wins_wo[draw].sum(axis=1)) / pairs[draw].sum(axis=1)
    low, high = np.quantile(delta, [1 - level, level])
    return float(low), float(high)


within_cell_permutation = inference.within_cell_permutation  # the within-cell test's shuffle, declared there


def shuffle_floor(outlier, cells) -> float:
    """The smallest p a within-cell shuffle can give: the chance that every cell's outliers get back their own
    family rows, the product over cells of 1 / C(runs in the cell, outliers in it) (one outlier in each of two
    cells of eight: 1 / 64; of three: 1 / 512). Holm over m rows needs it below alpha / m."""
    outlier, cells = np.asarray(outlier, bool), np.asarray(cells)
    floor = 1.0
    for label in np.unique(cells[outlier]):
        floor /= math.comb(int((cells == label).sum()), int((outlier & (cells == label)).sum()))
    return floor


@dataclass(frozen=True)
class OutlierTest:
    """One family's outlier test: the within-cell AUROCs of the out-of-fold predicted final loss, bounds, p."""

    auroc_without: float
    auroc_with: float
    low: float  # one-sided 95 % bounds of auroc_with - auroc_without (cell bootstrap)
    high: float
    p_value: float  # one-sided, from refits with the family shuffled within cells
    n_perm: int
    min_p: float  # max(1 / (1 + n_perm), :func:`shuffle_floor`)


def outlier_test(
    base, extra, target, anchor, outlier, labels: inference.RunLabels, refits: inference.Refits | None = None,
    candidates=None, n_boot: int = 1000,
) -> OutlierTest:  # fmt: skip
    """Does ``extra`` make the out-of-fold predicted final loss rank the outlier runs above their cell-mates?

    The models are the verdict's (:func:`topometrics.verdict.inference.base_folds` and ``with_family``:
    leave-one-group-out, the family orthogonalised on the base inside each training fold); a run's score is
    ``anchor`` + its predicted drop (``target`` = final - anchor). Statistic: AUROC(with) - AUROC(without)
    (:func:`within_cell_auroc`); p from refits with the family's rows permuted among the seeds of each cell
    (:func:`within_cell_permutation`; sequential with ``refits.stop`` as in ``family_test``; ``refits.seed`` also
    seeds the ``n_boot`` bootstrap of the bounds). Of ``labels`` it uses the cross-validation groups (seeds)
    and the rung x recipe cells. ``base`` (n_runs, n_base), ``extra`` (n_runs, n_extra); ``target``,
    ``anchor`` (n_runs,) in nats; ``outlier`` (n_runs,) bool. Rows must be complete (no NaN).

    Why within cells and not the verdict's cell blocks: the AUROC counts only pairs within a cell, so a
    family that merely marks a cell cannot move it, and what the null must break is the family's order
    *within* each cell. Moving whole cells leaves an outlier's cell marked whenever the permutation fixes
    that cell (one in four with four cells per rung), which would cap the p-value near that share.
    """
    refits = inference.Refits() if refits is None else refits
    groups, cells, n_perm, seed, stop = labels.groups, labels.cells, refits.n_perm, refits.seed, refits.stop
    base, extra, target, anchor = (np.asarray(a, float) for a in (base, extra, target, anchor))
    folds = inference.shared_base_folds(base, target, groups, candidates)  # every family's at this fraction
    with_ = inference.with_family(folds, extra, groups)
    paired = np.isfinite(folds.without) & np.isfinite(with_)
    flag = np.asarray(outlier, bool) & paired
    cells = np.asarray(cells)

    def auroc(pred: np.ndarray) -> float:
        return within_cell_auroc(np.where(paired, anchor + pred, np.nan), flag, cells)

    before, after = auroc(folds.without), auroc(with_)
    low, high = auroc_bounds((anchor + folds.without)[paired], (anchor + with_)[paired], flag[paired],
                             cells[paired], n_boot, seed)  # fmt: skip
    observed = after - before
    min_p = max(1 / (1 + max(n_perm, 0)), shuffle_floor(flag[paired], cells[paired]))
    if n_perm < 1 or not np.isfinite(observed) or min_p >= 1.0:
        return OutlierTest(before, after, low, high, float("nan"), 0, min_p)
    rng = np.random.default_rng(seed)
    hits = done = 0
    for refit in inference.stacked_refits(folds, extra, groups, lambda: within_cell_permutation(cells, rng), n_perm):
        hits += auroc(refit) - before >= observed - 1e-12
        done += 1
        if stop and hits >= stop:
            return OutlierTest(before, after, low, high, hits / done, done, min_p)
    return OutlierTest(before, after, low, high, (1 + hits) / (1 + done), done, min_p)


def outlier_verdict(
    inputs: pd.DataFrame, params: AnalysisParams, families: dict[str, tuple[str, ...]] | None = None
) -> pd.DataFrame:
    """One verdict row per fraction x topological family: does the family flag the outlier runs better?

    An outlier run ends more than ``analysis.outlier_sd`` robust SDs above the median of its rung x recipe
    cell's other seeds (:func:`outlier_runs`). Each row compares the loss curve + weight norm (the verdict's
    ``norm`` baseline, the loss-curve part chosen inside each fold) with it + the family, leave-one-seed-out,
    by :func:`outlier_test`. Role ``outlier``: exploratory, Holm-corrected over these rows only.

    Parameters
    ----------
    inputs : the verdict's inputs (:func:`topometrics.verdict.verdict.incremental_validity`)
    params : ``outlier_sd``, ``outlier_min_gain``, ``permutations``, ``seed``, ``alpha``, ``bootstrap``
    families : family name -> features (default the vocabulary's verdict families; only topological ones run)

    Returns
    -------
    DataFrame with :data:`topometrics.verdict.verdict.VERDICT_COLUMNS`; ``statistic`` is the AUROC gain.
    """
    families = verdict_families() if families is None else families
    columns = verdict.family_columns(families)
    topological = [name for name, feats in families.items() if verdict.family_kind(feats) == "topological"]
    base = verdict.baselines(families)[verdict.NORM_BASELINE]
    m = len(topological) * inputs["fraction"].nunique() if len(inputs) else 0
    n_perm = max(params.permutations, math.ceil(2 * m / params.alpha) - 1)  # Holm's first level reachable
    rows = []
    for fraction, g in inputs.groupby("fraction", sort=True):
        g = g.reset_index(drop=True)
        flagged = outlier_runs(g["actual"].to_numpy(float), _cell_labels(g), params.outlier_sd)
        g["_scored"] = np.isfinite(robust_z(g["actual"].to_numpy(float), _cell_labels(g)))
        for name in topological:
            row = {"cv": OUTLIER_SCHEME, "fraction": float(fraction), "family": name, "role": OUTLIER_ROLE}
            row |= {"comparison": "outliers (AUROC)", "baseline": verdict.NORM_BASELINE}
            rows.append(row | _outlier_row(g, flagged, base, columns[name], params, n_perm))
    return judge_outliers(pd.DataFrame(rows, columns=verdict.VERDICT_COLUMNS), params)


def _outlier_row(g, flagged, base, extra, params: AnalysisParams, n_perm: int) -> dict:
    """The numbers of one outlier row, or ``status='skipped'`` with its one reason."""
    why = verdict.scheme_problem(g, OUTLIER_SCHEME, float(g["fraction"].iloc[0]))
    if why is not None:
        return {"n": 0, "status": "skipped", "reason": why}
    keep = (g["n_seen"] >= verdict.MIN_CHECKPOINTS).to_numpy()
    g, flagged = g[keep].reset_index(drop=True), flagged[keep]
    base_cols, extra_cols = verdict.usable_columns(g, base)[0], verdict.usable_columns(g, extra)[0]
    if not base_cols or not extra_cols:
        return {"n": 0, "status": "skipped", "reason": "no usable inputs of the family or of the baseline"}
    base_cols += verdict.curve_extras(g, base_cols)
    target = (g["actual"] - g["anchor"]).to_numpy(float)
    usable = np.isfinite(g[base_cols + extra_cols].to_numpy(float)).all(axis=1) & np.isfinite(target)
    sub, flagged = g[usable].reset_index(drop=True), flagged[usable]
    cells = _cell_labels(sub)
    out = {"n": len(sub), "n_cells": len(np.unique(cells)), "n_groups": sub[OUTLIER_SCHEME].nunique()}
    out |= {"n_outliers": int(flagged.sum()), "inputs": ",".join(base_cols + extra_cols)}
    why = _label_problem(sub, flagged, params.outlier_sd)
    if why is not None:
        return out | {"status": "skipped", "reason": why}
    labels = inference.RunLabels(sub[OUTLIER_SCHEME].to_numpy(), sub["rung"].to_numpy(), cells, sub["seed"].to_numpy())
    test = outlier_test(
        sub[base_cols].to_numpy(float), sub[extra_cols].to_numpy(float), target[usable], sub["anchor"].to_numpy(),
        flagged, labels, inference.Refits(n_perm, params.seed, stop=10), verdict.base_candidates(base_cols),
        n_boot=params.bootstrap,
    )  # fmt: skip
    out |= {"auroc_without": test.auroc_without, "auroc_with": test.auroc_with, "auroc_low": test.low}
    out |= {"auroc_high": test.high, "statistic": test.auroc_with - test.auroc_without, "p_value": test.p_value}
    return out | {"min_p": test.min_p, "seed_sd": verdict.seed_sd(sub), "status": "ok"}


def _label_problem(sub: pd.DataFrame, flagged: np.ndarray, k: float) -> str | None:
    """Why the scored runs hold too few outliers to test (None when they hold :data:`MIN_OUTLIERS`)."""
    if not sub["_scored"].any():
        return "no cell has 4 runs whose final losses spread (a run's robust z needs 3 other seeds)"
    if flagged.sum() < MIN_OUTLIERS:
        found = "no outlier runs" if not flagged.any() else f"{int(flagged.sum())} outlier run"
        return f"{found} (final loss > {k:g} robust SDs above its cell's others) among {len(sub)}; need {MIN_OUTLIERS}"
    if sub[OUTLIER_SCHEME].nunique() < verdict.MIN_GROUPS:
        return f"runs with every input span {sub[OUTLIER_SCHEME].nunique()} seeds; need {verdict.MIN_GROUPS}"
    return None


def judge_outliers(rows: pd.DataFrame, params: AnalysisParams) -> pd.DataFrame:
    """``p_adjusted`` (Holm over the ok outlier rows) and the verdict word of each row.

    ``adds``: Holm p < alpha and an AUROC gain >= ``analysis.outlier_min_gain``; ``hurts``: the gain's 95 %
    upper bound < 0; ``not enough runs``: the smallest p the permutations give cannot pass Holm's first
    level; else ``no evidence``; a skipped row reads ``skipped: <reason>``.
    """
    out = rows.copy()
    ok = out["status"] == "ok"
    out["p_adjusted"] = np.nan
    out.loc[ok, "p_adjusted"] = inference.holm(out.loc[ok, "p_value"].to_numpy(float))
    level = params.alpha / max(int(ok.sum()), 1)
    out["verdict"] = [_outlier_word(r, level, params) if r["status"] == "ok" else f"skipped: {r['reason']}"
                      for _, r in out.iterrows()]  # fmt: skip
    return out


def _outlier_word(row, level: float, params: AnalysisParams) -> str:
    if not row["min_p"] < level:
        return f"not enough runs (n={int(row['n'])}, {int(row['n_outliers'])} outliers)"
    if row["p_adjusted"] < params.alpha and row["statistic"] >= params.outlier_min_gain:
        return "adds"
    if row["auroc_high"] < 0:
        return "hurts"
    return "no evidence"


def _cell_labels(g: pd.DataFrame) -> np.ndarray:
    """``rung|variant`` per row (``base`` where runs have no variant): the runs that differ only by seed."""
    variant = g["variant"].fillna("base").astype(str) if "variant" in g else pd.Series("base", index=g.index)
    return (g["rung"].astype(str) + "|" + variant).to_numpy()
