"""What makes the verdict computable, or able to show an effect: the skipped rows' causes and the settings.

:func:`skip_groups` groups the reasons of the ``topology_verdict`` view's skipped rows by cause;
:func:`remedy` derives the ``dvc exp run -S`` settings that let the comparisons run from the params
snapshot; :func:`recipes_needed` is the ``not enough runs`` rule turned around (how many rung x recipe
cells per rung the cell-block permutations need); :func:`answer_layout`, :func:`training_minutes` and
:func:`layout_command` state what an answer needs (the layout whose power was measured), what it costs to
train from the runs' own throughput, and the one command that trains it. Pure functions.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from topometrics.verdict.verdict import MIN_CHECKPOINTS, MIN_GROUPS

SURFACE_FAMILIES = ("landscape", "curvature")  # computed every features.landscape_every-th checkpoint only
SURFACE_POINTS = 3  # finite points a level and a rate need (topometrics.analysis.predict.window_summary)

# The reasons verdict.scheme_problem gives (the report groups skipped rows by them).
TOO_FEW_CHECKPOINTS = re.compile(r"^fraction (\S+) observes at most (\d+) checkpoints per run; need (\d+)$")
# The layout whose power was measured: the byte-level BPE sweep's 48 rung x recipe cells (16 recipes x 3 rungs),
# 2 seeds each, called 'adds' for a family explaining 30 % of the residual variance in 85 % of simulated sweeps
# fitted to its own variance components (`python -m bench power --calibrate`, docs/results.md). Power grows with
# cells, not seeds: the residual is mostly between cells.
ANSWER_CELLS = 48
ANSWER_SEEDS = 2
ANSWER_POWER = 0.85
RECIPE_SEED = 2026  # tools/sample_recipes.py's seed in the command: the same recipes on every machine


def skip_groups(view: pd.DataFrame) -> list[tuple[str, int]]:
    """The reasons of the view's skipped rows, one entry per cause with the number of comparisons it skipped,
    most first: the per-fraction shortage of checkpoints is one cause (naming each fraction), a column note
    (``; not used ...``) is dropped, every other reason is its own cause."""
    skipped = view.loc[view["verdict"].astype(str).str.startswith("skipped"), "verdict"].astype(str)
    reasons = skipped.str.removeprefix("skipped: ").str.split("; not used").str[0]
    short = reasons.str.extract(TOO_FEW_CHECKPOINTS)
    found = short[0].notna()
    groups = [(reason, int(n)) for reason, n in reasons[~found].value_counts().items()]
    if found.any():
        seen = short[found].drop_duplicates().astype(float).sort_values(0)
        fractions = ", ".join(f"{100 * f:g}%" for f in seen[0])
        most = ", ".join(f"{int(m)}" for m in seen[1])
        groups.append((f"by {fractions} of training the runs have at most {most} checkpoints; a comparison needs "
                       f"{int(seen[2].max())}", int(found.sum())))  # fmt: skip
    return sorted(groups, key=lambda g: -g[1])


def remedy(params: dict, need_runs: int = 0) -> list[tuple[str, str]]:
    """The ``dvc exp run -S`` settings that make the verdict computable for the declared runs, each with why
    (``params``: the params snapshot the warehouse keeps in ``meta``); empty when the design allows it.

    - the checkpoint spacing (:func:`checkpoint_remedy`);
    - some scheme needs :data:`MIN_GROUPS` groups: seeds are added after the largest until there are as many;
    - ``need_runs``: the runs a comparison needs to pass the corrected level (verdict ``not enough runs``):
      seeds are added until the declared runs reach it;
    - the loss-surface families' spacing (:func:`surface_remedy`), when the checkpoints' is right.
    """
    seeds, spacing = list(params["train"]["seeds"]), checkpoint_remedy(params)
    settings = list(spacing)
    groups = {"seed": len(seeds), "variant": 1 + len(params.get("variants") or {}), "rung": len(params["ladder"])}
    per_seed = groups["variant"] * groups["rung"]
    wanted = max(MIN_GROUPS if max(groups.values()) < MIN_GROUPS else 0, -(-need_runs // per_seed))
    if wanted > len(seeds):
        more = seeds + [max(seeds) + i for i in range(1, wanted - len(seeds) + 1)]
        why = f"{wanted} seeds, {wanted * per_seed} runs: leave-one-seed-out"
        settings.append((f"'train.seeds=[{','.join(map(str, more))}]'", why))
    return settings + (surface_remedy(params) if not spacing else [])  # a new spacing changes the surface's


def spacing_remedy(params: dict) -> list[tuple[str, str]]:
    """:func:`remedy` without seeds: the checkpoint spacing, or when that is right the loss surface's."""
    return checkpoint_remedy(params) or surface_remedy(params)


def checkpoint_remedy(params: dict) -> list[tuple[str, str]]:
    """A checkpoint every ``train.ckpt_every`` steps must give :data:`MIN_CHECKPOINTS` by the first fraction (step 0
    counts): the largest divisor of ``train.steps`` that does, or more steps; empty when the spacing gives them."""
    train, fractions = params["train"], params["analysis"]["fractions"]
    steps, every = int(train["steps"]), int(train["ckpt_every"])
    cutoff = min(fractions) * steps
    if cutoff // every + 1 >= MIN_CHECKPOINTS:
        return []
    fits = [d for d in range(1, steps + 1) if steps % d == 0 and cutoff // d + 1 >= MIN_CHECKPOINTS]
    when = f"by {100 * min(fractions):g}% of training"
    if fits:
        return [(f"train.ckpt_every={max(fits)}", f"{MIN_CHECKPOINTS} checkpoints {when}")]
    return [(f"train.steps={steps * MIN_CHECKPOINTS}", f"enough steps for a checkpoint {when}")]


def surface_remedy(params: dict) -> list[tuple[str, str]]:
    """The ``features.landscape_every`` that gives the loss-surface families :data:`SURFACE_POINTS`
    checkpoints by the first fraction (step 0 counts), with why; empty when they have them, are switched off,
    or no spacing can give them (then the checkpoint rule of :func:`remedy` comes first)."""
    features = params.get("features") or {}
    if "landscape_every" not in features or not set(SURFACE_FAMILIES) & set(features.get("families", ())):
        return []  # a snapshot without them predates the loss-surface families
    every, k = int(params["train"]["ckpt_every"]), int(features["landscape_every"])
    first = min(params["analysis"]["fractions"])
    cutoff = first * int(params["train"]["steps"])
    fits = [d for d in range(1, k) if cutoff // (d * every) + 1 >= SURFACE_POINTS]
    if cutoff // (k * every) + 1 >= SURFACE_POINTS or not fits:
        return []
    why = f"{SURFACE_POINTS} loss-surface checkpoints (landscape, curvature) by {100 * first:g}% of training"
    return [(f"features.landscape_every={max(fits)}", why)]


def recipes_needed(rungs: int, level: float, permutations: int) -> int | None:
    """The fewest rung x recipe cells per rung whose cell-block permutations can give a p below ``level``
    (the ``not enough runs`` rule: the smallest p is max(1 / (1 + permutations), 1 / (cells!)^rungs));
    None when ``permutations`` alone cannot reach it."""
    if 1 / (1 + permutations) >= level:
        return None
    cells = 2
    while 1 / math.factorial(cells) ** max(rungs, 1) >= level:
        cells += 1
    return cells


@dataclass(frozen=True)
class Layout:
    """A sweep's layout: its rungs, recipes (the base and its variants) and seeds per cell."""

    rungs: tuple[str, ...]
    recipes: int
    seeds: int

    @property
    def cells(self) -> int:
        return len(self.rungs) * self.recipes

    @property
    def runs(self) -> int:
        return self.cells * self.seeds


def declared_layout(params: dict) -> Layout:
    """The layout params declares (``params``: the warehouse's snapshot)."""
    recipes = 1 + len(params.get("variants") or {})
    return Layout(tuple(params["ladder"]), recipes, len(params["train"]["seeds"]))


def answer_layout(params: dict) -> Layout | None:
    """The declared rungs with the fewest recipes and seeds that reach :data:`ANSWER_CELLS` cells of
    :data:`ANSWER_SEEDS` seeds, and recipes enough for the cell permutations to pass ``analysis.alpha``
    (:func:`recipes_needed`); None when the declared layout already has them."""
    have = declared_layout(params)
    analysis = params["analysis"]
    permitted = recipes_needed(
        len(have.rungs), float(analysis.get("alpha", 0.05)), int(analysis.get("permutations", 99))
    )
    recipes = max(have.recipes, -(-ANSWER_CELLS // max(len(have.rungs), 1)), permitted or 0)
    need = Layout(have.rungs, recipes, max(have.seeds, ANSWER_SEEDS))
    return None if need == have else need


def training_minutes(params: dict, layout: Layout, tokens_per_s: Mapping[str, float], workers: int) -> float | None:
    """Wall minutes to train ``layout`` from scratch on ``workers`` processes: each run's tokens
    (``train.steps`` x ``train.batch_size`` x ``data.seq_len``) at its rung's measured throughput
    (``tokens_per_s``: tokens per second per process with the others running, checkpoints included), runs
    longest first to the first free process (the run queue's order). None when a rung has no throughput."""
    if any(tokens_per_s.get(rung) is None for rung in layout.rungs):
        return None
    train = params["train"]
    tokens = int(train["steps"]) * int(train["batch_size"]) * int(params["data"]["seq_len"])
    runs = sorted((tokens / tokens_per_s[rung] for rung in layout.rungs), reverse=True)
    finish = [0.0] * max(1, workers)
    for seconds in runs:
        for _ in range(layout.recipes * layout.seeds):
            heapq.heapreplace(finish, finish[0] + seconds)
    return max(finish) / 60


def layout_command(params: dict, layout: Layout) -> str:
    """The one ``dvc exp run`` that trains ``layout`` from the declared params: the missing recipes drawn by
    tools/sample_recipes.py, the seeds, and the checkpoint and loss-surface spacing (:func:`spacing_remedy`)."""
    have = declared_layout(params)
    seeds = list(params["train"]["seeds"])
    parts = ["dvc exp run"]
    if layout.recipes > have.recipes:
        steps = int(params["train"]["steps"])
        n = layout.recipes - have.recipes
        parts.append(f"$(python tools/sample_recipes.py --n {n} --seed {RECIPE_SEED} --steps {steps})")
    if layout.seeds > have.seeds:
        seeds += [max(seeds) + i for i in range(1, layout.seeds - have.seeds + 1)]
        parts.append(f"-S 'train.seeds=[{','.join(map(str, seeds))}]'")
    return " ".join(parts + [f"-S {setting}" for setting, _ in spacing_remedy(params)])
