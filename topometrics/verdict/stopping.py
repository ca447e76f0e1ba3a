"""Stopping decisions: stop the runs a predictor says will end worst, at a fraction of training. What does it
save, and how often does it kill the run that would have won?

The rule is successive halving's (Jamieson & Talwalkar 2016; Hyperband, Li et al. 2018): at a rung of the
budget, stop the worst ``kill_share`` of the runs. Successive halving ranks by the current loss
(:data:`topometrics.verdict.intervals.CURRENT`, the baseline here); every verdict predictor
(:func:`topometrics.verdict.intervals.predictors`: loss laws, + norm, + recipe, + each family) ranks by its
out-of-fold predicted final loss instead. For each fraction, predictor, kill share and scope (``sweep``: the
worst share of every run; ``rung``: of each rung's runs):

- ``saved``: the share of the sweep's training steps not run, sum over stopped runs of (1 - fraction) x steps
  over the sum of steps;
- ``best_killed``: whether the eventual best run (lowest final loss) is stopped (the mean over rungs for
  scope ``rung``), and ``p_best_killed``, the share of bootstrap sweeps in which it is;
- ``gap``: the best kept run's final loss minus the best run's (>= 0; nats, or the analysis loss unit);
- ``wrong_kills``: the share of runs stopped that belong to the kept share by their final loss (runs
  stopped that should not have been; the per-run regret whose mean the test compares).

Intervals are percentile bootstraps over the rung x recipe *cells* (every run of a drawn cell comes with
it), drawn once per cv x fraction and shared by every predictor (paired). The test ("helps decide"): at
equal savings (the same share stopped from the same runs) a family's predictor against the best baseline of
that cv x fraction x scope x share (fewest wrong kills): the per-run difference of ``wrong_kills`` on the
runs both rank, bounded with the cells as units by the verdict's own
:func:`topometrics.verdict.inference.cell_bounds` at level 1 - alpha / m (Bonferroni over the m family rows
of the cv x fraction x scope). ``helps decide`` needs its upper bound below 0.

Pure functions of arrays and DataFrames.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd

from topometrics.verdict import inference
from topometrics.verdict.intervals import CURRENT

KILL_SHARES = (0.25, 0.5, 0.75)  # shares of the runs stopped (successive halving's 1 - 1/eta for eta 4/3, 2, 4)
SCOPES = ("sweep", "rung")
MIN_RUNS = math.ceil(1 / min(KILL_SHARES))  # a scope's runs for the smallest share to stop one: 4
MIN_CELLS = 2  # cells the bootstrap and the test resample
STOPPING_COLUMNS = [
    "cv", "fraction", "scope", "kill_share", "predictor", "kind", "n", "n_cells", "killed", "saved", "saved_low",
    "saved_high", "best_killed", "p_best_killed", "gap", "gap_low", "gap_high", "wrong_kills", "versus",
    "delta_wrong", "delta_low", "delta_high", "decision", "status", "reason",
]  # fmt: skip


@dataclass(frozen=True)
class Resampling:
    """How the stopping rows are bounded: ``n_boot`` cell bootstraps drawn from ``seed`` for the intervals, and
    the family level ``alpha`` that the test's Bonferroni bounds split over a scope's family rows."""

    alpha: float
    n_boot: int = 1000
    seed: int = 0


class Rule(NamedTuple):
    """One stopping rule: at ``fraction`` of training, stop the worst ``share`` of each ``scope``'s runs."""

    scope: str  # 'sweep' (every run) or 'rung' (each rung's runs)
    share: float  # the share of a scope's runs stopped, floor(share x n)
    fraction: float  # the fraction of its steps a run trained before the decision


def outcome(predicted, actual, steps, groups, share: float, fraction: float) -> dict:
    """What stopping the worst ``share`` of each group by ``predicted`` does.

    Parameters
    ----------
    predicted, actual, steps : array_like, shape (n_runs,)
        The ranking value (higher = stopped first), the final loss, and each run's training steps.
    groups : array_like, shape (n_runs,)
        The scope's groups (one label: the whole sweep). A group with fewer than :data:`MIN_RUNS` runs stops
        none and counts in no mean.
    share, fraction : the share of each group stopped (floor(share x n) runs), the fraction trained before.

    Returns
    -------
    dict
        ``killed`` (bool per run), ``wrong`` (bool per run: stopped, but among the group's best n - k by final
        loss), ``saved``, ``best_killed`` and ``gap`` (means over the deciding groups; NaN when none decides).
    """
    p, a, s, g = (np.asarray(x) for x in (predicted, actual, steps, groups))
    killed, wrong = np.zeros(len(p), bool), np.zeros(len(p), bool)
    best, gaps = [], []
    for label in np.unique(g):
        idx = np.flatnonzero(g == label)
        k = math.floor(share * len(idx))
        if len(idx) < MIN_RUNS or not 0 < k < len(idx):
            continue
        stop = idx[np.argsort(p[idx], kind="stable")[len(idx) - k :]]
        truly = idx[np.argsort(a[idx], kind="stable")[len(idx) - k :]]
        killed[stop] = True
        wrong[np.setdiff1d(stop, truly)] = True
        winner = idx[np.argmin(a[idx])]
        best.append(float(killed[winner]))
        gaps.append(float(a[np.setdiff1d(idx, stop)].min() - a[winner]))
    saved = float((1 - fraction) * s[killed].sum() / s.sum()) if s.sum() > 0 else np.nan
    return {"killed": killed, "wrong": wrong, "saved": saved, "best_killed": _mean(best), "gap": _mean(gaps)}


def bootstrap_outcomes(predicted, actual, steps, groups, share: float, fraction: float, rows) -> dict:
    """:func:`outcome`'s ``saved``, ``best_killed`` and ``gap`` in every bootstrap sweep at once.

    ``rows``: (n_draws, width) int, each draw's runs as indices into ``predicted``, ``actual``, ``steps`` and
    ``groups`` (shape (n_runs,)), -1 past its end or where a run is left out. Returns those three as arrays of
    shape (n_draws,), equal to :func:`outcome` of each draw's runs (to the bit for whole-number ``steps``, whose
    sums are exact in any order; tested): the ranks within each group come from one stable sort per group
    across all draws, instead of a sort per draw and group.
    """
    p, a, s, g = (np.asarray(x) for x in (predicted, actual, steps, groups))
    rows = np.asarray(rows, int).reshape(len(rows), -1)
    n_draws, width = rows.shape
    present, at = rows >= 0, np.maximum(rows, 0)
    if not present.any():  # no draw has a run (none drawn, or none ranked): nothing decides
        return {key: np.full(n_draws, np.nan) for key in ("saved", "best_killed", "gap")}
    ps, acts, labels, stp = p[at], a[at], g[at], np.where(present, s[at], 0.0)
    killed = np.zeros(rows.shape, bool)
    best, gaps, deciding = np.zeros(n_draws), np.zeros(n_draws), np.zeros(n_draws)
    every, positions = np.arange(n_draws), np.broadcast_to(np.arange(width), rows.shape)
    for label in np.unique(g):
        member = present & (labels == label)
        n = member.sum(axis=1)
        k = np.floor(share * n).astype(int)
        decides = (n >= MIN_RUNS) & (k > 0) & (k < n)
        order = np.argsort(np.where(member, ps, np.inf), axis=1, kind="stable")  # members first, ties by position
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, positions, axis=1)
        stop = member & (rank >= (n - k)[:, None]) & decides[:, None]
        killed |= stop
        winner = np.argmin(np.where(member, acts, np.inf), axis=1)  # the first of equal losses, as np.argmin
        kept = np.where(member & ~stop, acts, np.inf).min(axis=1, initial=np.inf)
        best += np.where(decides, stop[every, winner], 0.0)
        gaps += np.where(decides, kept - acts[every, winner], 0.0)
        deciding += decides
    total = stp.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        saved = np.where(total > 0, (1 - fraction) * np.where(killed, stp, 0.0).sum(axis=1) / total, np.nan)
        return {"saved": saved, "best_killed": np.where(deciding > 0, best / deciding, np.nan),
                "gap": np.where(deciding > 0, gaps / deciding, np.nan)}  # fmt: skip


def draw_matrix(draws: list[np.ndarray]) -> np.ndarray:
    """The bootstrap draws as one (n_draws, longest) int array, -1 past each draw's end."""
    width = max((len(d) for d in draws), default=0)
    out = np.full((len(draws), width), -1)
    for i, draw in enumerate(draws):
        out[i, : len(draw)] = draw
    return out


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else np.nan


def cell_draws(cells, n_boot: int, seed: int) -> list[np.ndarray]:
    """``n_boot`` bootstrap sweeps: row indices of every run of ``len(unique cells)`` cells drawn with
    replacement (a cell drawn twice brings its runs twice)."""
    cells = np.asarray(cells)
    labels = np.unique(cells)
    if not len(labels):
        return []
    members = [np.flatnonzero(cells == c) for c in labels]
    rng = np.random.default_rng(seed)
    return [np.concatenate([members[j] for j in rng.integers(0, len(labels), len(labels))]) for _ in range(n_boot)]


def decision_table(
    ranked: pd.DataFrame, kinds: dict[str, str], fraction: float, cv: str, resampling: Resampling
) -> pd.DataFrame:
    """The ``stopping`` rows of one cv x fraction: :data:`STOPPING_COLUMNS`.

    ``ranked``: one row per run with ``rung``, ``cell``, ``actual``, ``steps`` and one column per predictor
    (its predicted final loss, or the current loss for :data:`CURRENT`; NaN where it has none); ``kinds``:
    predictor -> 'baseline' or 'family'.
    """
    rows = []
    draws = draw_matrix(cell_draws(ranked["cell"].to_numpy(), resampling.n_boot, resampling.seed))
    for scope in SCOPES:
        for share in KILL_SHARES:
            rule = Rule(scope, share, fraction)
            rows += _tested(ranked, [_row(ranked, name, kinds[name], rule, draws) for name in kinds], rule)
    out = pd.DataFrame(rows).assign(cv=cv, fraction=fraction)
    return _judged(out, resampling.alpha).reindex(columns=STOPPING_COLUMNS)


def _groups(frame: pd.DataFrame, scope: str) -> np.ndarray:
    return frame["rung"].astype(str).to_numpy() if scope == "rung" else np.zeros(len(frame), int)


def _row(ranked: pd.DataFrame, name: str, kind: str, rule: Rule, draws: np.ndarray) -> dict:
    """One predictor's numbers under a rule, or a skipped row that says how many runs it needs."""
    scope, share, fraction = rule
    base = {"scope": scope, "kill_share": share, "predictor": name, "kind": kind}
    ok = np.isfinite(ranked[name].to_numpy(float)) & np.isfinite(ranked["actual"].to_numpy(float))
    sub = ranked[ok]
    why = too_small(sub, scope)
    base |= {"n": len(sub), "n_cells": sub["cell"].nunique()}
    if why:
        return base | {"status": "skipped", "reason": why, "decision": f"skipped: {why}"}
    pred, actual, steps, groups = (sub[name].to_numpy(float), sub["actual"].to_numpy(float),
                                   sub["steps"].to_numpy(float), _groups(sub, scope))  # fmt: skip
    found = outcome(pred, actual, steps, groups, share, fraction)
    position = np.full(len(ranked), -1)
    position[np.flatnonzero(ok)] = np.arange(len(sub))
    # the paired cell draws, restricted to the runs this predictor ranks (-1: a run it does not, or none)
    rows = np.where(draws >= 0, position[np.maximum(draws, 0)], -1) if draws.size else draws
    boots = bootstrap_outcomes(pred, actual, steps, groups, share, fraction, rows)
    saved, best, gap = (boots[k] for k in ("saved", "best_killed", "gap"))
    interval = lambda x: np.nanquantile(x, [0.025, 0.975]) if np.isfinite(x).any() else (np.nan, np.nan)  # noqa: E731
    base |= {"killed": int(found["killed"].sum()), "saved": found["saved"], "best_killed": found["best_killed"]}
    base |= dict(zip(("saved_low", "saved_high"), interval(saved), strict=True))
    base |= {"p_best_killed": float(np.nanmean(best)) if np.isfinite(best).any() else np.nan, "gap": found["gap"]}
    base |= dict(zip(("gap_low", "gap_high"), interval(gap), strict=True))
    return base | {"wrong_kills": float(found["wrong"].mean()), "status": "ok"}


def too_small(runs: pd.DataFrame, scope: str) -> str | None:
    """Why these runs cannot carry a stopping decision at a scope (None when they can): fewer runs than the
    kill shares can split, or one cell to resample; the reason says how many are needed."""
    n, cells = len(runs), runs["cell"].nunique() if len(runs) else 0
    if scope == "rung":
        largest = int(runs.groupby("rung").size().max()) if n else 0
        if largest < MIN_RUNS:
            return (f"no rung has {MIN_RUNS} runs (the most: {largest}); a {min(KILL_SHARES):.0%} kill share "
                    f"within a rung needs {MIN_RUNS} runs of that rung")  # fmt: skip
    if n < MIN_RUNS:
        return (
            f"{n} runs; a {min(KILL_SHARES):.0%} kill share needs at least {MIN_RUNS} runs (train {MIN_RUNS - n} more)"
        )
    if cells < MIN_CELLS:
        return (
            f"{n} runs in {cells} cell; the bootstrap and the test resample cells: need {MIN_CELLS} rung x recipe cells"
        )
    return None


def _tested(ranked: pd.DataFrame, rows: list[dict], rule: Rule) -> list[dict]:
    """Each family row's paired difference in wrong kills against the best baseline (cell-unit bounds later)."""
    scope, share, fraction = rule
    done = [r for r in rows if r["status"] == "ok"]
    bases = [r for r in done if r["kind"] == "baseline"]
    if not bases:
        return rows
    best = min(bases, key=lambda r: (r["wrong_kills"], r["predictor"] != CURRENT))["predictor"]
    for r in rows:
        if r["kind"] != "family" or r["status"] != "ok":
            continue
        both = ranked[np.isfinite(ranked[[r["predictor"], best, "actual"]].to_numpy(float)).all(axis=1)]
        args = (both["actual"].to_numpy(float), both["steps"].to_numpy(float), _groups(both, scope), share, fraction)
        wrong_f = outcome(both[r["predictor"]].to_numpy(float), *args)["wrong"]
        wrong_b = outcome(both[best].to_numpy(float), *args)["wrong"]
        r |= {"versus": best, "_difference": wrong_f.astype(float) - wrong_b, "_cells": both["cell"].to_numpy()}
    return rows


def _judged(out: pd.DataFrame, alpha: float) -> pd.DataFrame:
    """The bounds of every tested family row (Bonferroni over the family rows of each scope
    of this cv x fraction) and its word."""
    out = out.copy()
    for col in ("delta_wrong", "delta_low", "delta_high", "versus"):
        out[col] = out.get(col, np.nan)
    out["decision"] = out["decision"].astype(object) if "decision" in out else None
    for _scope, g in out.groupby("scope"):
        tested = g.index[g["versus"].notna()] if "_difference" in g else []
        level = 1 - alpha / max(len(tested), 1)
        for i in tested:
            mean, low, high, _ = inference.cell_bounds(out.at[i, "_difference"], out.at[i, "_cells"], level)
            out.loc[i, ["delta_wrong", "delta_low", "delta_high"]] = mean, low, high
            word = "helps decide" if high < 0 else ("no evidence" if np.isfinite(high) else "not enough cells")
            out.at[i, "decision"] = word
    ok = out["status"] == "ok"
    out.loc[ok & (out["kind"] == "baseline"), "decision"] = "baseline"
    return out.drop(columns=[c for c in ("_difference", "_cells") if c in out])


def stopping_table(predicted: pd.DataFrame, inputs: pd.DataFrame, steps: pd.DataFrame, fractions,
                   resampling: Resampling, min_seen: int = 4) -> pd.DataFrame:  # fmt: skip
    """The ``stopping`` table: :func:`decision_table` for every cv of the verdict's between-run predictions
    (``predicted``: :func:`topometrics.verdict.intervals.predictors`) and every one of ``fractions``.

    ``inputs``: the verdict's inputs (``rung``, ``variant``, ``seed``, ``fraction``, ``anchor``, ``n_seen``);
    runs that observed fewer than ``min_seen`` checkpoints rank by nothing. ``steps``: ``rung``, ``variant``,
    ``seed``, ``steps`` (each run's training steps). With no verdict predictions (too few runs for the
    verdict) the current loss is still ranked, under cv ``none``.
    """
    keys = ["rung", "variant", "seed"]
    between = predicted[predicted["level"].fillna("between") == "between"] if len(predicted) else predicted
    cvs = sorted(between["cv"].unique()) if len(between) else ["none"]
    runs = inputs.reindex(columns=[*keys, "fraction", "actual", "anchor", "n_seen"])
    runs = runs.assign(variant=runs["variant"].fillna("base")).merge(steps, on=keys, how="left")
    frames = []
    for cv in cvs:
        for fraction in sorted(float(f) for f in fractions):
            g = runs[np.isclose(runs["fraction"].astype(float), fraction)]
            mine = between[(between["cv"] == cv) & np.isclose(between["fraction"].astype(float), fraction)]
            ranked = g.assign(cell=g["rung"].astype(str) + "|" + g["variant"].astype(str))
            ranked[CURRENT] = np.where(g["n_seen"] >= min_seen, g["anchor"], np.nan)
            kinds = {CURRENT: "baseline"}
            for name, p in mine.groupby("predictor", sort=True):
                wide = p.assign(variant=p["variant"].fillna("base"))[[*keys, "predicted"]].rename(
                    columns={"predicted": name}
                )
                ranked = ranked.merge(wide, on=keys, how="left")
                kinds[name] = str(p["kind"].iloc[0])
            frames.append(decision_table(ranked, kinds, float(fraction), cv, resampling))
    if not frames:
        return pd.DataFrame(columns=STOPPING_COLUMNS)
    return pd.concat(frames, ignore_index=True)
