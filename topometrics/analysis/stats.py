"""Statistics SQL cannot do: p-values, bootstrap CIs, correlation comparisons, robust power-law fits.

Pure functions over arrays. Randomness comes only from an explicit ``seed``. Fits never raise on
a bad curve and never return a silent NaN: :class:`Fit` carries ``status`` ('ok' or 'failed')
and the ``reason``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, stats

B_BOUND = 3.0  # |b| of f(N) = a N^b + c; steeper laws than N^3 are not plausible for per-model summaries


@dataclass(frozen=True)
class SpearmanResult:
    """Spearman's rho with its p-value and a percentile bootstrap CI (resampling checkpoint pairs)."""

    rho: float
    p_value: float
    ci_low: float
    ci_high: float
    n: int
    n_boot_valid: int  # resamples where both sides varied (rho defined)
    reason: str | None = None  # why rho or the CI is undefined


@dataclass(frozen=True)
class Fit:
    """A fitted curve: parameters by name, goodness of fit, and whether it succeeded."""

    status: str  # 'ok' or 'failed'
    params: dict[str, float] = field(default_factory=dict)
    r2: float | None = None
    n: int = 0
    reason: str | None = None
    spearman_rho: float | None = None
    spearman_p: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def spearman_bootstrap(x, y, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> SpearmanResult:
    """Spearman's rho of ``x`` and ``y`` with scipy's p-value and a bootstrap CI.

    Parameters
    ----------
    x, y : array_like, shape (n,)
        Paired observations (e.g. a feature and the validation loss at each checkpoint); pairs with
        a NaN on either side are dropped.
    n_boot : int
        Bootstrap resamples of the pairs (the paper's section 3.3 uses 1,000).
    seed : int
        Seed of the resampling generator.
    level : float
        Confidence level of the percentile interval.
    """
    x, y = _paired(x, y)
    n = len(x)
    if n < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        why = f"{n} finite pairs" if n < 3 else "a constant series"
        return SpearmanResult(np.nan, np.nan, np.nan, np.nan, n, 0, reason=f"rho undefined: {why}")
    res = stats.spearmanr(x, y)
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    boot = _row_pearson(stats.rankdata(x[idx], axis=1), stats.rankdata(y[idx], axis=1))
    boot = boot[np.isfinite(boot)]
    if len(boot) < 2:
        return SpearmanResult(
            float(res.statistic), float(res.pvalue), np.nan, np.nan, n, len(boot), "no valid resample"
        )
    lo, hi = np.percentile(boot, [50 * (1 - level), 50 * (1 + level)])
    return SpearmanResult(float(res.statistic), float(res.pvalue), float(lo), float(hi), n, len(boot))


@dataclass(frozen=True)
class PartialResult:
    """Partial Spearman rho of x and y given a control z, its p-value and a bootstrap CI."""

    rho: float
    p_value: float
    ci_low: float
    ci_high: float
    n: int
    reason: str | None = None  # why rho is undefined, or why it is 0 by definition


def partial_spearman(x, y, z, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> PartialResult:
    """Spearman's rho of ``x`` and ``y`` with the control ``z`` partialled out.

    The ranks of x and y (average ranks for ties) are each regressed on the ranks of z by least
    squares; rho is the Pearson correlation of the two residuals (equal to the partial-correlation
    formula over the three Spearman rhos). The p-value is the t-test with n - 3 degrees of freedom;
    the CI is a percentile bootstrap over the triples (seeded). Triples with a NaN are dropped.

    When x's ranks are a linear function of z's (x a monotone function of the control) nothing
    of x is left beyond z: rho is 0 by definition, with that reason. When y's are, rho is undefined.
    """
    x, y, z = (np.asarray(v, dtype=float) for v in (x, y, z))
    if not x.shape == y.shape == z.shape or x.ndim != 1:
        raise ValueError(f"x, y and z must be 1-D of equal length, got shapes {x.shape}, {y.shape}, {z.shape}")
    keep = np.isfinite(x) & np.isfinite(y) & np.isfinite(z)
    x, y, z = x[keep], y[keep], z[keep]
    n = len(x)
    if n < 4 or min(np.ptp(x), np.ptp(y), np.ptp(z)) == 0:
        why = f"{n} finite triples" if n < 4 else "a constant series"
        return PartialResult(np.nan, np.nan, np.nan, np.nan, n, f"partial rho undefined: {why}")
    rho, degenerate = _partial_rank_corr(*(stats.rankdata(v)[None, :] for v in (x, y, z)))
    if degenerate[0] == "y":
        why = "val_loss is a monotone function of the control"
        return PartialResult(np.nan, np.nan, np.nan, np.nan, n, f"partial rho undefined: {why}")
    if degenerate[0] == "x":
        return PartialResult(0.0, 1.0, 0.0, 0.0, n, "feature is a monotone function of the control: 0 by definition")
    r = float(rho[0])
    t = r * np.sqrt((n - 3) / max(1 - r * r, 1e-300))
    p = float(2 * stats.t.sf(abs(t), n - 3))
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    boot, bad = _partial_rank_corr(*(stats.rankdata(v[idx], axis=1) for v in (x, y, z)))
    boot = np.where(bad == "x", 0.0, boot)[bad != "y"]
    boot = boot[np.isfinite(boot)]
    if len(boot) < 2:
        return PartialResult(r, p, np.nan, np.nan, n, "no valid resample")
    lo, hi = np.percentile(boot, [50 * (1 - level), 50 * (1 + level)])
    return PartialResult(r, p, float(lo), float(hi), n)


def _partial_rank_corr(rx: np.ndarray, ry: np.ndarray, rz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise Pearson correlation of the residuals of rx and ry after regressing each on rz.

    Returns the correlations and, per row, ``'x'``/``'y'`` when that residual vanishes (relative
    sum of squares below 1e-20), ``''`` otherwise.
    """

    def residual(r):
        rc, zc = r - r.mean(axis=1, keepdims=True), rz - rz.mean(axis=1, keepdims=True)
        zz = (zc * zc).sum(axis=1, keepdims=True)
        slope = np.divide((rc * zc).sum(axis=1, keepdims=True), zz, out=np.zeros_like(zz), where=zz > 0)
        res = rc - slope * zc
        tiny = (res * res).sum(axis=1) <= 1e-20 * np.maximum((rc * rc).sum(axis=1), 1e-300)
        return res, tiny

    (ex, tiny_x), (ey, tiny_y) = residual(rx), residual(ry)
    flag = np.where(tiny_y, "y", np.where(tiny_x, "x", ""))
    return _row_pearson(np.where(tiny_x[:, None], 0.0, ex), np.where(tiny_y[:, None], 0.0, ey)), flag


def steiger_z(r_xy: float, r_zy: float, r_xz: float, n: int) -> tuple[float, float]:
    """Compare two dependent correlations that share variable ``y`` (Steiger 1980, eq. 14).

    Both correlations are measured on the same checkpoints (e.g. a topological feature x and a
    spectral feature z against the loss y), so the independent-samples Fisher-z test would be
    wrong; Steiger's test uses the Fisher z-transforms and corrects for ``r_xz``.

    Returns
    -------
    z : float
        Positive when |corr(x, y)| is the larger in the direction of ``r_xy - r_zy``.
    p_value : float
        Two-sided.
    """
    if n <= 3:
        raise ValueError(f"steiger_z needs n > 3 paired observations, got n={n}")
    # |r| = 1 (a perfectly monotone series) would make z infinite and the covariance term 0/0
    r_xy, r_zy = np.clip([r_xy, r_zy], -0.999999, 0.999999)
    z_xy, z_zy = np.arctanh([r_xy, r_zy])
    r_bar = (r_xy + r_zy) / 2
    psi = r_xz * (1 - 2 * r_bar**2) - 0.5 * r_bar**2 * (1 - 2 * r_bar**2 - r_xz**2)
    cov = psi / (1 - r_bar**2) ** 2
    z = (z_xy - z_zy) * np.sqrt((n - 3) / max(2 - 2 * cov, 1e-12))
    return float(z), float(2 * stats.norm.sf(abs(z)))


def bonferroni(p_values, alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Bonferroni-adjusted p-values ``min(1, m p)`` over the m finite p-values, and ``adjusted < alpha``."""
    p = np.asarray(p_values, dtype=float)
    m = int(np.isfinite(p).sum())
    adjusted = np.minimum(1.0, p * max(m, 1))
    return adjusted, np.where(np.isfinite(adjusted), adjusted < alpha, False)


def mean_ci(values, level: float = 0.95) -> tuple[float, float, float]:
    """Mean and Student-t CI of independent replicates (e.g. one rho per seed); NaN CI for fewer than 2."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return np.nan, np.nan, np.nan
    if len(v) < 2:
        return float(v.mean()), np.nan, np.nan
    half = stats.t.ppf(0.5 + level / 2, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v))
    return float(v.mean()), float(v.mean() - half), float(v.mean() + half)


def correlation_mean_ci(rhos, level: float = 0.95) -> tuple[float, float, float]:
    """Mean and CI of independent correlation coefficients (one per seed), in Fisher-z space.

    z = arctanh(rho) is near-normal, so the Student-t interval is taken over the z values and mapped
    back with tanh: the estimate is tanh(mean z) and the interval stays inside [-1, 1] (a t-interval
    on the rho values themselves does not). |rho| = 1 is clipped to 1 - 1e-12 so z stays finite.
    """
    r = np.asarray(rhos, dtype=float)
    z = np.arctanh(np.clip(r[np.isfinite(r)], -1 + 1e-12, 1 - 1e-12))
    return tuple(float(np.tanh(v)) for v in mean_ci(z, level))


def power_law(n, a: float, b: float, c: float):
    """f(N) = a * N**b + c (paper section 3.3)."""
    return a * np.power(n, b) + c


def fit_power_law(n, y) -> Fit:
    """Fit f(N) = a N^b + c to final-checkpoint values ``y`` of rungs with ``n`` parameters.

    Robust by construction: N is rescaled by its geometric mean for conditioning; the start
    comes from straight lines in log-log space for a few offsets c0, the best fit of those is kept;
    the fit is bounded (|b| <= :data:`B_BOUND`; an exponent at the bound is a failed fit).
    A failure is returned as ``Fit(status='failed', reason=...)``.
    Also returns Spearman's rho of (N, y) and R^2 on the original scale.
    """
    n, y = _paired(n, y)
    if np.any(n <= 0):
        raise ValueError(f"parameter counts must be positive, got {n[n <= 0].tolist()}")
    if len(n) < 4:
        return Fit("failed", n=len(n), reason=f"need at least 4 rungs for 3 parameters, got {len(n)}")
    if np.ptp(y) == 0:
        return Fit("failed", n=len(n), reason="constant values across rungs")
    ref = float(np.exp(np.mean(np.log(n))))
    x = n / ref
    span = 10 * (np.abs(y).max() + np.ptp(y))
    bounds = ([-np.inf, -B_BOUND, -span], [np.inf, B_BOUND, span])
    # Starts: a straight line in log-log space for several offsets c0 (0 when y keeps one sign, just
    # below the minimum, just above the maximum: the last catches decreasing laws with b > 0, a < 0).
    offsets = ([0.0] if np.all(y > 0) or np.all(y < 0) else []) + [y.min() - 0.1 * np.ptp(y), y.max() + 0.1 * np.ptp(y)]
    best, reason, best_sse = None, "no start converged", np.inf
    for c0 in offsets:
        slope, intercept = np.polyfit(np.log(x), np.log(np.abs(y - c0)), 1)
        sign = 1.0 if np.median(y - c0) > 0 else -1.0
        p0 = [sign * np.exp(intercept), np.clip(slope, -0.9 * B_BOUND, 0.9 * B_BOUND), c0]
        params, why = curve_fit_bounded(power_law, x, y, p0, bounds)
        sse = np.sum((power_law(x, *params) - y) ** 2) if params is not None else np.inf
        if sse < best_sse:
            best, best_sse = params, sse
        reason = why or reason
    params = best
    rho, p = stats.spearmanr(n, y)
    if params is None:
        return Fit("failed", n=len(n), reason=reason, spearman_rho=float(rho), spearman_p=float(p))
    a, b, c = params
    if abs(b) >= B_BOUND - 1e-6:
        why = f"exponent b hit its bound {b:+.0f}: the values do not follow a power law in N"
        return Fit("failed", n=len(n), reason=why, spearman_rho=float(rho), spearman_p=float(p))
    # a was fitted against N / ref: a (N/ref)^b = (a ref^-b) N^b
    named = {"a": float(a * ref**-b), "b": float(b), "c": float(c)}
    r2 = r_squared(y, power_law(x, *params))
    return Fit("ok", named, r2, len(n), spearman_rho=float(rho), spearman_p=float(p))


def curve_fit_bounded(
    model: Callable, x, y, p0: Sequence[float], bounds, jac: Callable | None = None
) -> tuple[np.ndarray | None, str | None]:
    """``scipy.optimize.curve_fit`` with bounds; returns (params, None) or (None, reason), never raises on a bad fit.

    ``jac(x, *params)`` (shape (n, n_params)), when given, replaces finite differences.
    """
    lower, upper = (np.asarray(b, dtype=float) for b in bounds)
    start = np.clip(np.asarray(p0, dtype=float), lower, upper)
    with warnings.catch_warnings():
        # An unidentifiable covariance is not a failed fit: only the parameters are used.
        warnings.simplefilter("ignore", optimize.OptimizeWarning)
        try:
            params, _ = optimize.curve_fit(
                model, x, y, p0=start, bounds=(lower, upper), max_nfev=5000, jac=jac if jac is not None else "2-point"
            )
        except (RuntimeError, ValueError, FloatingPointError) as err:
            return None, f"curve_fit did not converge: {err}"
    pred = model(x, *params)
    if not (np.all(np.isfinite(params)) and np.all(np.isfinite(pred))):
        return None, f"non-finite fit: params={params.tolist()}"
    return params, None


def r_squared(y, predicted) -> float:
    """Coefficient of determination 1 - SS_res / SS_tot."""
    y, predicted = np.asarray(y, float), np.asarray(predicted, float)
    ss_tot = np.sum((y - y.mean()) ** 2)
    return float(1 - np.sum((y - predicted) ** 2) / ss_tot) if ss_tot > 0 else np.nan


def _paired(x, y) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"x and y must be 1-D of equal length, got shapes {x.shape} and {y.shape}")
    keep = np.isfinite(x) & np.isfinite(y)
    return x[keep], y[keep]


def _row_pearson(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a - a.mean(axis=1, keepdims=True)
    b = b - b.mean(axis=1, keepdims=True)
    denom = np.sqrt((a * a).sum(axis=1) * (b * b).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom > 0, (a * b).sum(axis=1) / denom, np.nan)
