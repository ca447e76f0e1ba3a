"""The verdict's baselines, declared once: what a researcher already knows about a run, as input columns.

A baseline is the smaller model of a comparison. It is built from *parts* (:data:`PARTS`), each a set of
input columns of the verdict's per-run table (``topometrics.analysis.tables`` computes them):

``loss``     the three loss laws' predicted drop from the last observed loss (power law, multi-power law,
             LR-annealing law): the loss curve so far
``rank``     the same-fraction loss ranked across runs            (a candidate of the loss-curve part)
``grad``     the gradient norm's mean and log-spread so far       (a candidate of the loss-curve part)
``norm``     the weight norm's level and relative rate
``recipe``   the run's recipe, known before training (:data:`RECIPE`): log peak LR, weight decay, warm-up
             share, schedule kind and decay fraction, log batch size, log steps, log parameter count of the
             rung, log vocabulary size (the tokenizer)

The loss-curve part is chosen inside each training fold among :data:`CURVE_CANDIDATES` (a part marked
``candidate``); every other part's columns always enter. The named baselines (:data:`BASELINES`) are
``loss``, ``norm`` (loss curve + weight norm) and ``recipe`` (loss curve + weight norm + recipe, the
default); ``<baseline>+<geometric verdict family>`` adds that family's columns (e.g. ``recipe+curvature``).

A family may be a nonlinear, monotone transform of what the base knows (sharpness scales with 1/LR, a norm
enters through its logarithm); a base linear in its inputs would leave that bend for the family to take.
So the columns in :data:`FLEXIBLE` enter with a monotone basis (:func:`flexible_basis`: their normal
scores and the square of their standardised values), as flexible as a family's level and rate.

To add a baseline part: a recipe key is one entry in :data:`RECIPE`; any other part is one :class:`Part` in
:data:`PARTS`, named in the :data:`BASELINES` it joins, and its columns computed per run by
``topometrics.analysis.tables`` (``docs/developing.md``, Recipes); the verdict reads the parts from here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats


@dataclass(frozen=True)
class Part:
    """One part of a baseline: its name, its input columns, what it means, whether it is a loss-curve candidate."""

    name: str
    columns: tuple[str, ...]
    meaning: str
    candidate: bool = False  # True: one of the loss-curve alternatives chosen per fold, not always in


def _log(value) -> float:
    return math.log(float(value)) if value is not None and float(value) > 0 else math.nan


def _schedule(recipe: dict) -> str:
    return str(recipe.get("schedule") or "cosine")  # the config holds the schedule only when it is not the cosine


# Recipe column -> its value from a run's config (``data/config/<run>.json``: ``recipe`` keys, ``n_params``,
# ``model.vocab_size``). NaN where the config lacks the key (an external series).
RECIPE = {
    "recipe_log_lr": lambda c: _log(c["recipe"].get("lr")),
    "recipe_weight_decay": lambda c: float(c["recipe"].get("weight_decay", math.nan)),
    "recipe_warmup_share": lambda c: float(c["recipe"].get("warmup", 0)) / float(c["recipe"].get("steps") or math.nan),
    "recipe_wsd": lambda c: float(_schedule(c["recipe"]) == "wsd"),
    "recipe_constant_decay": lambda c: float(_schedule(c["recipe"]) == "constant_decay"),
    "recipe_decay_fraction": lambda c: 0.0 if _schedule(c["recipe"]) == "cosine"
    else float(c["recipe"].get("decay_fraction", 0.2)),
    "recipe_log_batch": lambda c: _log(c["recipe"].get("batch_size")),
    "recipe_log_steps": lambda c: _log(c["recipe"].get("steps")),
    "recipe_log_params": lambda c: _log(c.get("n_params")),
    "recipe_log_vocab": lambda c: _log(c.get("model", {}).get("vocab_size")),
}  # fmt: skip

PARTS = (
    Part("loss", ("loss_drop", "mpl_drop", "tissue_drop"), "the loss laws' predicted drop from the last loss"),
    Part("rank", ("loss_rank",), "the same-fraction loss ranked across runs", candidate=True),
    Part("grad", ("gn_mean", "gn_spread"), "the gradient norm's mean and log-spread so far", candidate=True),
    Part("norm", ("weight_norm_level", "weight_norm_rate"), "the weight norm's level and relative rate"),
    Part("recipe", tuple(RECIPE), "the run's recipe and size, known before training"),
)
PART = {p.name: p for p in PARTS}
LOSS, GRAD, NORM, RECIPE_COLUMNS = (PART[n].columns for n in ("loss", "grad", "norm", "recipe"))
CURVE = tuple(c for p in PARTS if p.name == "loss" or p.candidate for c in p.columns)  # the loss-curve columns
# The loss-curve part is chosen inside each training fold among these (a new candidate is one more entry).
CURVE_CANDIDATES = (LOSS, *((c,) for c in LOSS), (), PART["rank"].columns, GRAD, (*LOSS, *GRAD))
BASELINES = {"loss": ("loss",), "norm": ("loss", "norm"), "recipe": ("loss", "norm", "recipe")}  # name -> parts
DEFAULT = "recipe"  # every verdict row's smaller model unless it says otherwise
FLEXIBLE = ("weight_norm_level", "recipe_log_lr")  # enter with a monotone basis (flexible_basis)


def columns(name: str) -> tuple[str, ...]:
    """The input columns of a named baseline (``loss``, ``norm``, ``recipe``); KeyError for others."""
    return tuple(c for part in BASELINES[name] for c in PART[part].columns)


def recipe_inputs(config: dict) -> dict[str, float]:
    """A run's :data:`RECIPE` columns from its config dict (NaN for what the config does not state)."""
    config = {"recipe": {}} | dict(config or {})
    out = {}
    for name, value in RECIPE.items():
        try:
            out[name] = float(value(config))
        except (TypeError, ValueError, ZeroDivisionError):
            out[name] = math.nan
    return out


def flexible_basis(frame: pd.DataFrame, base_cols: list[str]) -> tuple[pd.DataFrame, list[str]]:
    """``frame`` with two more columns per :data:`FLEXIBLE` column among ``base_cols`` that varies: its normal
    scores over the rows (``<c>~rank``: any monotone transform of it has the same ones) and the square of its
    standardised values (``<c>~sq``: a bend), and ``base_cols`` with them. NaNs stay NaN."""
    frame, added = frame.copy(), []
    for c in (c for c in FLEXIBLE if c in base_cols):
        x = frame[c].to_numpy(float)
        ok = np.isfinite(x)
        if ok.sum() < 3 or np.ptp(x[ok]) == 0:
            continue
        score, square = np.full(len(x), np.nan), np.full(len(x), np.nan)
        score[ok] = stats.norm.ppf((stats.rankdata(x[ok]) - 0.5) / ok.sum())
        square[ok] = ((x[ok] - x[ok].mean()) / x[ok].std()) ** 2
        frame[f"{c}~rank"], frame[f"{c}~sq"] = score, square
        added += [f"{c}~rank", f"{c}~sq"]
    return frame, [*base_cols, *added]
