"""Final-loss prediction from the first part of training (paper section 3.3, Table 5).

Every method is fitted to data, none is hand-set:

1. ``loss_power_law``: L(t) = a t^(-b) + c fitted to the observed validation losses.
2. ``schedule_aware``: a simplified multi-power law (Luo et al. 2025, arXiv:2503.12811) that
   reads the learning-rate schedule, known in advance from the recipe (see :func:`multi_power_law`).
   ``lr_annealing``: the learning-rate annealing law of Tissue et al. 2024 (arXiv:2408.11029),
   L = L0 + A S1^(-alpha) - C S2, from the same schedule (see :func:`lr_annealing_law`).
3. Learned models (``topology``, ``loss_topology``, gradient- and weight-norm baselines): ridge
   regressions of the remaining loss drop, fitted with leave-one-group-out cross-validation
   (:func:`cross_validate`): the held-out rung (or seed) never contributes to its own model.

Pure functions over arrays; a failed fit is returned with its reason, never raised.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
from scipy.signal import lfilter
from sklearn.linear_model import RidgeCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from topometrics.analysis.stats import Fit, curve_fit_bounded, r_squared
from topometrics.models.lr_schedule import Schedule

# Multi-power-law exponents held fixed (beta = gamma, one of the MPL paper's two variants): the
# 10-25 early checkpoints available here cannot identify all seven MPL parameters.
MPL_BETA = 0.5
MPL_GAMMA = 0.5
ANNEALING_DECAY = 0.999  # lambda of the annealing momentum (Tissue et al. 2024 use 0.999)
RIDGE_ALPHAS = np.logspace(-3, 3, 13)  # chosen per fold by efficient leave-one-out inside the training rungs


def observed(t, cutoff: float) -> np.ndarray:
    """Mask of checkpoints available after ``cutoff`` steps (e.g. 30% of 5000)."""
    return np.asarray(t, dtype=float) <= cutoff + 1e-9


def loss_power_law(t, a: float, b: float, c: float):
    """L(t) = a t^(-b) + c."""
    return a * np.power(t, -b) + c


def fit_loss_power_law(t, loss, total_steps: int, warmup: int = 0) -> tuple[Fit, float | None]:
    """Fit L(t) = a t^(-b) + c to observed (step, val_loss) pairs and extrapolate to ``total_steps``.

    Checkpoints at step 0 are dropped (t^(-b) is infinite) and so are those inside the warm-up
    when at least 4 remain, because the warm-up is not part of the power-law regime. Time is
    rescaled by ``total_steps`` for conditioning; the start is the best straight line in log-log
    space over a grid of offsets c < min(L); bounds a >= 0, 0 <= b <= 3, 0 <= c <= min(L).

    Returns
    -------
    fit : Fit
        ``params`` a (in steps), b, c; ``r2`` on the fitted points.
    predicted : float or None
        L(total_steps), None when the fit failed.
    """
    t, loss = np.asarray(t, float), np.asarray(loss, float)
    keep = (t > 0) & np.isfinite(loss)
    if (keep & (t > warmup)).sum() >= 4:
        keep &= t > warmup
    t, loss = t[keep], loss[keep]
    if len(t) < 4:
        return Fit("failed", n=len(t), reason=f"need at least 4 checkpoints after step 0, got {len(t)}"), None
    x = t / total_steps
    lo = float(loss.min())
    candidates = [_loglog_start(x, loss, lo * f) for f in (0.0, 0.5, 0.8, 0.9, 0.95, 0.99)]
    p0 = min(candidates, key=lambda c: c[1])[0]
    params, reason = curve_fit_bounded(loss_power_law, x, loss, p0, ([0.0, 0.0, 0.0], [np.inf, 3.0, lo]))
    if params is None:
        return Fit("failed", n=len(t), reason=reason), None
    a, b, c = params
    named = {"a": float(a * total_steps**b), "b": float(b), "c": float(c)}
    fit = Fit("ok", named, r_squared(loss, loss_power_law(x, *params)), len(t))
    return fit, float(loss_power_law(1.0, *params))


def multi_power_law(t, schedule: Schedule, l0: float, a: float, alpha: float, b: float, c: float) -> np.ndarray:
    """Simplified multi-power law (Luo et al. 2025): loss after ``t`` steps of ``schedule``.

    L(t) = L0 + A (S1(t))^(-alpha) - LD(t), with S1(t) = sum_{tau<=t} eta_tau (the warm-up area S_W
    included) and the annealing bonus
    LD(t) = B sum_{k=W+1}^{t} (eta_{k-1} - eta_k) G(eta_k^(-gamma) S_k(t)), G(x) = 1 - (C x + 1)^(-beta),
    S_k(t) = sum_{tau=k}^{t} eta_tau. The LR eta is divided by its peak and the areas by
    ``schedule.steps``, so A, B and C are dimensionless; beta = gamma = 0.5 are fixed (:data:`MPL_BETA`).
    A plain power law in t misreads a cosine schedule: late steps move the weights less (small
    S1 gain) but the decay itself lowers the loss (LD); both terms come from the known schedule.
    """
    return _mpl_eval(_mpl_terms(t, schedule), l0, a, alpha, b, c)


def _mpl_terms(t, schedule: Schedule) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The parameter-free parts of :func:`multi_power_law` at steps ``t``, computed once per fit."""
    t = np.atleast_1d(np.asarray(t, dtype=int))
    eta = schedule.rate(np.arange(0, schedule.steps + 1)) / schedule.lr  # eta[k] = LR of update k; eta[0] = 0
    area = np.cumsum(eta) / schedule.steps  # area[t] = S1(t) / steps
    drops, scaled, segment = [], [], []
    for i, ti in enumerate(t):
        k = np.arange(schedule.warmup + 1, max(ti, schedule.warmup) + 1)
        drops.append(eta[k - 1] - eta[k])
        # eta_k -> 0 at the end of a cosine to zero: G saturates at 1 there; the floor avoids 0^(-gamma).
        scaled.append(np.power(np.maximum(eta[k], 1e-6), -MPL_GAMMA) * (area[ti] - area[k - 1]))
        segment.append(np.full(len(k), i))
    return np.maximum(area[t], 1e-12), np.concatenate(drops), np.concatenate(scaled), np.concatenate(segment)


def _mpl_eval(terms, l0: float, a: float, alpha: float, b: float, c: float) -> np.ndarray:
    area, drop, scaled, segment = terms
    bonus = np.bincount(segment, weights=drop * (1 - np.power(c * scaled + 1, -MPL_BETA)), minlength=len(area))
    return l0 + a * np.power(area, -alpha) - b * bonus


def _mpl_jacobian(terms, l0: float, a: float, alpha: float, b: float, c: float) -> np.ndarray:
    """d L / d (L0, A, alpha, B, C) of :func:`_mpl_eval`: one pass instead of six finite-difference calls."""
    area, drop, scaled, segment = terms
    inner = c * scaled + 1
    bonus = np.bincount(segment, weights=drop * (1 - np.power(inner, -MPL_BETA)), minlength=len(area))
    d_bonus_dc = np.bincount(
        segment, weights=drop * MPL_BETA * np.power(inner, -MPL_BETA - 1) * scaled, minlength=len(area)
    )
    forward = np.power(area, -alpha)
    return np.column_stack([np.ones_like(area), forward, -a * forward * np.log(area), -bonus, -b * d_bonus_dc])


def fit_multi_power_law(t, loss, schedule: Schedule) -> tuple[Fit, float | None]:
    """Fit :func:`multi_power_law` (L0, A, alpha, B, C) to observed checkpoints; extrapolate to the last step.

    Starts from L0 = 0.9 min(L), a log-log line for A and alpha, B = 0.1 range(L), C = 1; bounds
    keep every parameter non-negative (L0 <= min(L), alpha <= 3, C in [1e-3, 1e3]) and the
    annealing amplitude B below the observed loss range: early in a cosine schedule the LR has
    barely decayed, so B and C are weakly identified (only their product early on) and an
    unbounded B extrapolates to absurd end-of-schedule drops.
    """
    t, loss = np.asarray(t, float), np.asarray(loss, float)
    keep = (t > 0) & np.isfinite(loss)
    if (keep & (t > schedule.warmup)).sum() >= 6:
        keep &= t > schedule.warmup  # as in fit_loss_power_law: the warm-up transient is not modelled
    t, loss = t[keep].astype(int), loss[keep]
    if len(t) < 6:
        return Fit("failed", n=len(t), reason=f"need at least 6 checkpoints for 5 parameters, got {len(t)}"), None
    lo, spread = float(loss.min()), float(np.ptp(loss)) or 1.0
    terms = _mpl_terms(t, schedule)
    (a0, alpha0, _), _ = _loglog_start(terms[0], loss, 0.9 * lo)
    p0 = [0.9 * lo, a0, alpha0, 0.1 * spread, 1.0]
    bounds = ([0.0, 0.0, 0.0, 0.0, 1e-3], [lo, np.inf, 3.0, spread, 1e3])

    def model(_t, *p):
        return _mpl_eval(terms, *p)

    def jacobian(_t, *p):
        return _mpl_jacobian(terms, *p)

    params, reason = curve_fit_bounded(model, t, loss, p0, bounds, jac=jacobian)
    if params is None:
        return Fit("failed", n=len(t), reason=reason), None
    named = dict(zip(("L0", "A", "alpha", "B", "C"), map(float, params), strict=True))
    named |= {"beta": MPL_BETA, "gamma": MPL_GAMMA}
    fit = Fit("ok", named, r_squared(loss, model(t, *params)), len(t))
    return fit, float(multi_power_law([schedule.steps], schedule, *params)[0])


def annealing_areas(schedule: Schedule) -> tuple[np.ndarray, np.ndarray]:
    """S1 and S2 of Tissue et al. 2024 after every step ``0..steps``, in units of (peak LR x steps).

    S1(s) = sum_{i<=s} eta_i, the forward area (warm-up included); S2(s) = sum_{i<=s} m_i with the
    annealing momentum m_i = lambda m_{i-1} + (eta_{i-1} - eta_i) after the warm-up (0 during it),
    lambda = :data:`ANNEALING_DECAY`. eta is the schedule's LR divided by its peak.
    """
    eta = schedule.rate(np.arange(0, schedule.steps + 1)) / schedule.lr
    drop = np.zeros_like(eta)
    drop[1:] = eta[:-1] - eta[1:]
    drop[: schedule.warmup + 1] = 0.0
    momentum = lfilter([1.0], [1.0, -ANNEALING_DECAY], drop)
    return np.cumsum(eta) / schedule.steps, np.cumsum(momentum) / schedule.steps


def lr_annealing_law(s1, s2, l0: float, a: float, alpha: float, c: float) -> np.ndarray:
    """L = L0 + A S1^(-alpha) - C S2 (Tissue et al. 2024, "Scaling law with learning rate annealing")."""
    return l0 + a * np.power(np.maximum(s1, 1e-12), -alpha) - c * s2


def fit_lr_annealing(t, loss, schedule: Schedule) -> tuple[Fit, float | None]:
    """Fit :func:`lr_annealing_law` (L0, A, alpha, C) to observed checkpoints; extrapolate to the last step.

    Checkpoints at step 0 are dropped, and those inside the warm-up when at least 5 remain. Bounds:
    0 <= L0 <= min(L), A >= 0, 0 <= alpha <= 3, and 0 <= C with the annealing bonus at the end
    C S2(steps) at most the observed loss range: early in a decaying schedule S2 is still near 0, so
    C is barely identified and an unbounded C extrapolates to absurd end-of-schedule drops (the
    same reasoning bounds the multi-power law's B).
    """
    t, loss = np.asarray(t, float), np.asarray(loss, float)
    keep = (t > 0) & np.isfinite(loss)
    if (keep & (t > schedule.warmup)).sum() >= 5:
        keep &= t > schedule.warmup
    t, loss = t[keep].astype(int), loss[keep]
    if len(t) < 5:
        return Fit("failed", n=len(t), reason=f"need at least 5 checkpoints for 4 parameters, got {len(t)}"), None
    s1, s2 = annealing_areas(schedule)
    lo, spread = float(loss.min()), float(np.ptp(loss)) or 1.0
    c_max = spread / s2[-1] if s2[-1] > 0 else 1e-9
    (a0, alpha0, _), _ = _loglog_start(s1[t], loss, 0.9 * lo)
    bounds = ([0.0, 0.0, 0.0, 0.0], [lo, np.inf, 3.0, c_max])

    def model(_t, *p):
        return lr_annealing_law(s1[t], s2[t], *p)

    params, reason = curve_fit_bounded(model, t, loss, [0.9 * lo, a0, alpha0, 0.0], bounds)
    if params is None:
        return Fit("failed", n=len(t), reason=reason), None
    named = dict(zip(("L0", "A", "alpha", "C"), map(float, params), strict=True)) | {"lambda": ANNEALING_DECAY}
    fit = Fit("ok", named, r_squared(loss, model(t, *params)), len(t))
    return fit, float(lr_annealing_law(s1[-1], s2[-1], *params))


def window_summary(t, values, cutoff: float) -> tuple[float, float]:
    """Level and relative rate of a series over the observed window ``t <= cutoff``.

    level: mean of the last quarter of the observed points (robust to per-step noise);
    rate: least-squares slope over the last half, per unit of ``cutoff``, divided by the series' scale there,
    ``sqrt(level^2 + sd^2)`` (sd: the SD of the last half's values), so series of different scale across rungs
    (sums over layers) stay comparable. Far from zero it is slope / |level|; a level that crosses zero cannot
    make it explode (slope / |level| would), since the sd of a moving series is never ~0: |rate| <= 2 sqrt(12)
    for a straight line. Both NaN when fewer than 3 finite points are observed; rate 0 for a constant 0.
    """
    t, v = np.asarray(t, float), np.asarray(values, float)
    keep = observed(t, cutoff) & np.isfinite(v)
    t, v = t[keep], v[keep]
    if len(t) < 3:
        return np.nan, np.nan
    order = np.argsort(t)
    t, v = t[order], v[order]
    level = float(v[-max(1, len(v) // 4) :].mean())
    half = slice(len(t) // 2, None)
    if np.ptp(t[half]) == 0:
        return level, np.nan
    slope = np.polyfit(t[half] / cutoff, v[half], 1)[0]
    scale = float(np.hypot(level, v[half].std()))
    return level, float(slope / scale) if scale > 0 else 0.0


def value_at(t, values, cutoff: float) -> float:
    """The value at the last observed checkpoint ``t <= cutoff`` (NaN when none is observed, or its value is
    NaN): the level of a series that is already a trailing-window summary (the trajectory's dimension over
    the steps before each checkpoint), which is then known at the fraction itself, not only once 3 are."""
    t, v = np.asarray(t, float), np.asarray(values, float)
    seen = observed(t, cutoff)
    return float(v[seen][np.argmax(t[seen])]) if seen.any() else np.nan


def gradnorm_window(t, grad_norm, cutoff: float) -> tuple[float, float]:
    """Mean and spread of the logged gradient norm over the observed window ``1 <= t <= cutoff``.

    mean: the arithmetic mean of the norm (the pre-clipping global 2-norm ``steps.csv`` logs);
    spread: the sample standard deviation (ddof 1) of its natural log, a scale-free spread that a
    few spikes of a noisy norm do not dominate as they would its SD. Only finite, positive norms
    count; both NaN with fewer than 2 of them.
    """
    t, g = np.asarray(t, float), np.asarray(grad_norm, float)
    keep = (t >= 1) & observed(t, cutoff) & np.isfinite(g) & (g > 0)
    if keep.sum() < 2:
        return np.nan, np.nan
    return float(g[keep].mean()), float(np.log(g[keep]).std(ddof=1))


def cross_validate(x: np.ndarray, y: np.ndarray, groups) -> tuple[np.ndarray, list[np.ndarray], list[str | None]]:
    """Leave-one-group-out predictions of a standardised ridge regression.

    Parameters
    ----------
    x : ndarray, shape (n_runs, n_features)
        Features per run; a row with any NaN is neither trained on nor predicted.
    y : ndarray, shape (n_runs,)
        Target per run (the remaining loss drop); NaN rows are not trained on.
    groups : array_like, shape (n_runs,)
        Rung (or seed) of each run: all runs of the held-out group are left out of its model.

    Returns
    -------
    predicted : ndarray, shape (n_runs,)
        NaN where the run could not be predicted.
    trained_on : list of ndarray
        Per run, the indices of the rows its model was fitted on (empty when not predicted).
    reasons : list of str or None
        Why a run was not predicted.
    """
    x, y, groups = np.asarray(x, float), np.asarray(y, float), np.asarray(groups)
    usable = np.all(np.isfinite(x), axis=1)
    predicted = np.full(len(y), np.nan)
    trained_on = [np.array([], dtype=int) for _ in y]
    reasons: list[str | None] = [None if u else "missing feature values in the observed window" for u in usable]
    for held in np.unique(groups):
        test = (groups == held) & usable
        train = np.flatnonzero((groups != held) & usable & np.isfinite(y))
        if not test.any():
            continue
        if len(train) < 3:
            for i in np.flatnonzero(test):
                reasons[i] = f"only {len(train)} training runs outside group {held}; need 3"
            continue
        model = make_pipeline(StandardScaler(), RidgeCV(alphas=RIDGE_ALPHAS)).fit(x[train], y[train])
        predicted[test] = model.predict(x[test])
        for i in np.flatnonzero(test):
            trained_on[i] = train
    return predicted, trained_on, reasons


def _loglog_start(x, y, offset: float) -> tuple[list[float], float]:
    """(a, b, c) start for y = a x^(-b) + c from a straight line through log(y - c) vs log x, and its residual."""
    z = np.log(np.maximum(y - offset, 1e-12))
    slope, intercept = np.polyfit(np.log(x), z, 1)
    resid = float(np.sum((np.polyval([slope, intercept], np.log(x)) - z) ** 2))
    return [float(np.exp(intercept)), float(np.clip(-slope, 0.0, 3.0)), float(offset)], resid


def prediction_summary(predictions: pd.DataFrame, shown: int = 3) -> str:
    """'<n> predictions (<k> failed: <count> <why>; ...)': the failures grouped by cause, the loss-curve fits'
    shortage of checkpoints first (on a short run it is why the learned models lack their inputs too), then
    the others, most common first. Reasons that differ only in a count or a run are one group."""
    failed = predictions.loc[predictions["status"] == "failed", "reason"].fillna("no reason recorded")
    text = f"{len(predictions)} predictions ({len(failed)} failed"
    if failed.empty:
        return text + ")"
    found = failed.str.extract(_TOO_FEW_CHECKPOINTS).astype(float)
    short = found[0].notna()
    groups = []
    if short.any():
        need, got = found.loc[short, 0], int(found.loc[short, 1].max())
        at_least = f"{int(need.min())}" if need.nunique() == 1 else f"{int(need.min())}-{int(need.max())}"
        why = f"checkpoints after step 0 up to the fraction, got at most {got}"
        groups.append(f"{int(short.sum())} need ≥ {at_least} {why}")
    others = failed[~short].map(_reason_group).value_counts(sort=False).sort_values(ascending=False, kind="stable")
    groups += [f"{n} {reason}" for reason, n in others.items()]
    more = f"; {len(groups) - shown} other reasons" if len(groups) > shown else ""
    return f"{text}: {'; '.join(groups[:shown])}{more})"


# A loss-curve fit's reason (topometrics.analysis.predict): the checkpoints it needs and those it observed.
_TOO_FEW_CHECKPOINTS = r"^need at least (\d+) checkpoints .*, got (\d+)$"


def _reason_group(reason: str) -> str:
    """A failure reason in words that hold for every prediction of its cause (no run name, no count)."""
    if reason == "missing feature values in the observed window":  # the learned models' inputs
        return "lack an input before the fraction (a failed loss-curve fit or a missing feature)"
    held_out = r"^only \d+ training runs outside group \S+; need (\d+)$"  # topometrics.analysis.predict
    return re.sub(held_out, r"have fewer than \1 training runs outside the held-out group", reason)
