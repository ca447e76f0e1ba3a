"""Changepoints of a run's series over its checkpoints (validation loss, a feature, the learning rate).

The breaks are found by ``ruptures``' PELT (Killick et al. 2012): the exact minimiser of the summed
segment costs plus a penalty per break, where binary segmentation is a greedy approximation of the same
objective; at a few hundred checkpoints PELT costs milliseconds, so nothing is gained by approximating.
``jump=1``: every checkpoint is a candidate break. ruptures' default ``jump=5`` only considers every fifth
index and moves a true break at index 23 of 51 points to two breaks at 20 and 25.

Two segment models: ``"l2"`` (a piecewise-constant mean: level shifts) and ``"slope"`` (the same on the
first differences: a piecewise-linear trend's changes of slope, e.g. a learning rate's warm-up ending; a
break at difference ``i`` is a break at point ``i``). ruptures' own ``"clinear"`` fits each segment through
its two noisy end points and ``"linear"`` lets the line jump at a break; on a kinked series with noise both
misplace breaks more often than the differenced mean shift (8 and 9 of 30 seeded series at noise 0.1 of
a slope change of 0.3, against 2). Differencing doubles the noise variance, so ``"slope"`` needs cleaner
series than ``"l2"``. A smooth curve (a cosine decay) has no true break: PELT cuts it into short pieces, so
only the first changepoint of such a series means anything. The penalty is scale
free: the series is divided by its noise level ``sigma``, a robust estimate from second differences
(``MAD / 0.6745 / sqrt(6)``, blind to level shifts and linear trends), floored at
:data:`NOISE_FLOOR` times the series' range so a noiseless series (a schedule) still has a scale; the
penalty per break is ``penalty * log(n)`` in those units (``penalty = 2`` is BIC's; the default 5 finds a
break in 2 of 200 seeded noise series of 51 points, and both breaks of a 4-sigma step series within one
checkpoint in 197 of 200).

Series shorter than :data:`MIN_LENGTH` give NULL with a reason; a constant series has no changepoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import ruptures

MODELS = ("l2", "slope")
MIN_SEGMENT = 2  # checkpoints per segment, at least (ruptures' min_size)
MIN_LENGTH = 3 * MIN_SEGMENT  # a series shorter than this has room for one break at most at its very ends
NOISE_FLOOR = 1e-3  # sigma is at least this share of the series' range (a noiseless series keeps a scale)


class SeriesChangepoints(NamedTuple):
    """The changepoints of one series: the steps where a new segment starts (ascending), the first of them
    (NaN when there is none), how many, and the reason when the series could not be segmented (then
    ``count`` is None and ``first_step`` NaN)."""

    steps: tuple[int, ...]
    first_step: float
    count: int | None
    reason: str | None = None


def noise_scale(values: np.ndarray) -> float:
    """Robust noise standard deviation of a series (n,), from its second differences, floored at
    :data:`NOISE_FLOOR` times its range (0 only for a constant series)."""
    values = np.asarray(values, dtype=np.float64)
    d2 = np.diff(values, n=2)
    mad = float(np.median(np.abs(d2 - np.median(d2)))) if d2.size else 0.0
    return max(mad / 0.6745 / np.sqrt(6.0), NOISE_FLOOR * float(np.ptp(values)))


def changepoints(values: np.ndarray, penalty: float = 5.0, model: str = "l2") -> list[int] | str:
    """Indices where a new segment of ``values`` (n,) starts (ascending, each in ``[MIN_SEGMENT, n - MIN_SEGMENT]``),
    by PELT with ``jump=1``; or a string saying why the series cannot be segmented.

    ``penalty``: the cost of one break in units of ``log(n)`` times the noise variance (module docstring);
    larger finds fewer breaks.
    """
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    if not penalty > 0:
        raise ValueError(f"penalty must be positive, got {penalty}")
    values = np.asarray(values, dtype=np.float64).ravel()
    if model == "slope":
        found = changepoints(np.diff(values), penalty, "l2") if values.size > MIN_LENGTH else None
        return (
            found
            if found is not None
            else f"{values.size} checkpoints, fewer than the {MIN_LENGTH + 1} a change of slope needs"
        )
    n = values.size
    if n < MIN_LENGTH:
        return f"{n} checkpoints, fewer than the {MIN_LENGTH} a changepoint needs ({MIN_SEGMENT} on each side)"
    if not np.isfinite(values).all():
        return "non-finite values in the series"
    sigma = noise_scale(values)
    if sigma == 0:  # a constant series: one segment
        return []
    signal = ((values - values.mean()) / sigma)[:, None]
    algo = ruptures.Pelt(model="l2", min_size=MIN_SEGMENT, jump=1).fit(signal)
    return [int(b) for b in algo.predict(pen=penalty * np.log(n))[:-1]]  # the last "break" is n itself


def series_changepoints(
    steps: Sequence[int], values: np.ndarray, penalty: float = 5.0, model: str = "l2"
) -> SeriesChangepoints:
    """:func:`changepoints` of ``values`` (n,) measured at the training ``steps`` (n,), as steps."""
    steps = np.asarray(steps)
    values = np.asarray(values, dtype=np.float64).ravel()
    if steps.shape != values.shape:
        raise ValueError(f"steps {steps.shape} and values {values.shape} differ in shape")
    found = changepoints(values, penalty, model)
    if isinstance(found, str):
        return SeriesChangepoints((), np.nan, None, found)
    at = tuple(int(steps[i]) for i in found)
    return SeriesChangepoints(at, float(at[0]) if at else np.nan, len(at))


def first_index(found: list[int] | str) -> int | None:
    """The first changepoint's index in :func:`changepoints`' answer, None without one."""
    return found[0] if isinstance(found, list) and found else None


def changepoint_lags(
    feature: np.ndarray,
    val_loss: np.ndarray,
    lr: np.ndarray,
    penalty: float = 5.0,
    model: str = "l2",
    lr_model: str = "slope",
) -> dict[str, float | str | None]:
    """How many checkpoints a feature's first changepoint comes after the validation loss's, and each after
    the learning rate's (all three series (n,) at the same checkpoints).

    Returns ``feature_vs_val``, ``feature_vs_lr``, ``val_vs_lr`` (float checkpoints: the first series'
    first changepoint index minus the second's; negative = the first series breaks earlier; NaN when
    either has none) and a ``reason`` per NaN lag (None where the lag is a number). The learning rate is
    segmented with ``lr_model`` (its warm-up ends in a change of slope, not of level).
    """
    series = {
        "feature": changepoints(feature, penalty, model),
        "val": changepoints(val_loss, penalty, model),
        "lr": changepoints(lr, penalty, lr_model),
    }
    out: dict[str, float | str | None] = {}
    for a, b in (("feature", "val"), ("feature", "lr"), ("val", "lr")):
        ia, ib = first_index(series[a]), first_index(series[b])
        key = f"{a}_vs_{b}"
        out[key] = float(ia - ib) if ia is not None and ib is not None else np.nan
        missing = [
            f"{name}: {found if isinstance(found, str) else 'no changepoint'}"
            for name, found in ((a, series[a]), (b, series[b]))
            if first_index(found) is None
        ]
        out[f"{key}_reason"] = "; ".join(missing) or None
    return out


def run_changepoint_rows(
    series: dict[str, tuple[np.ndarray, np.ndarray]],
    reference: str,
    lr: tuple[np.ndarray, np.ndarray] | str,
    penalty: float = 5.0,
) -> list[dict]:
    """One run's changepoint rows: for each series (name -> (steps (n,), values (n,)); the validation loss
    ``reference`` among them) and the learning rate (or the reason it is missing), ``kind = 'changepoint'``
    with ``estimate`` the first changepoint's step and ``n`` the count (:func:`series_changepoints` of the
    series' finite values; the learning rate with the ``"slope"`` model); for every other series,
    ``kind = 'changepoint_lag'`` with ``other`` the reference or ``'lr'`` and ``estimate`` the lag in
    checkpoints of the reference's steps (positions of the two first changepoints among them; negative: the
    series breaks first). A NaN estimate carries its ``reason``."""
    found = {}
    for name, pair in [*series.items(), ("lr", lr)]:
        if isinstance(pair, str):
            found[name] = SeriesChangepoints((), np.nan, None, pair)
            continue
        steps, values = (np.asarray(a) for a in pair)
        keep = np.isfinite(values)
        found[name] = series_changepoints(steps[keep], values[keep], penalty, "slope" if name == "lr" else "l2")
    rows = [
        {"kind": "changepoint", "feature": name, "estimate": f.first_step, "n": f.count}
        | {"reason": f.reason or (None if f.count else "no changepoint")}
        for name, f in found.items()
    ]
    grid = np.sort(np.asarray(series[reference][0]))
    for name in series:
        if name == reference:
            continue
        for other in (reference, "lr"):
            a, b = found[name], found[other]
            missing = [f"{n}: {f.reason or 'no changepoint'}" for n, f in ((name, a), (other, b)) if not f.count]
            lag = (
                np.nan if missing else float(np.searchsorted(grid, a.first_step) - np.searchsorted(grid, b.first_step))
            )
            rows.append({"kind": "changepoint_lag", "feature": name, "other": other, "estimate": lag} | {
                "n": int(grid.size), "reason": "; ".join(missing) or None})  # fmt: skip
    return rows


def window_changepoints(
    series: Sequence[tuple[np.ndarray, np.ndarray]], cutoff: float, total_steps: float, penalty: float = 5.0
) -> tuple[float, float]:
    """What the changepoints of several series (each ``(steps (n,), values (n,))``) say by the step ``cutoff``:
    ``(count, first)``, the number of changepoints found in the checkpoints at or before ``cutoff`` (finite
    values), summed over the series, and the earliest of them as a share of ``total_steps``, or
    ``cutoff / total_steps`` when none has one yet (a break is known not to come before the cutoff).

    ``(NaN, NaN)`` when no series can be segmented in the window (each has fewer than :data:`MIN_LENGTH`
    finite points): a count from too few points would read as "no change". The inputs of the between-run
    verdict's changepoint family: only what was observed by the cutoff, so nothing of the future leaks in."""
    count, first, segmented = 0, np.inf, False
    for steps, values in series:
        steps, values = np.asarray(steps, dtype=np.float64), np.asarray(values, dtype=np.float64)
        keep = (steps <= cutoff) & np.isfinite(values)
        order = np.argsort(steps[keep], kind="stable")
        found = series_changepoints(steps[keep][order], values[keep][order], penalty)
        if found.count is None:
            continue
        segmented, count = True, count + found.count
        first = min(first, found.first_step) if found.count else first
    if not segmented:
        return np.nan, np.nan
    return float(count), float(min(first, cutoff) / total_steps)
