"""What makes the verdict computable, or able to show an effect: the skipped rows' causes and the settings.

:func:`skip_groups` groups the reasons of the ``topology_verdict`` view's skipped rows by cause;
:func:`remedy` derives the ``dvc exp run -S`` settings that let the comparisons run from the params
snapshot; :func:`recipes_needed` is the ``not enough runs`` rule turned around (how many rung x recipe
cells per rung the cell-block permutations need). Pure functions.
"""

from __future__ import annotations

import math
import re

import pandas as pd

from topometrics.params import FeaturesParams
from topometrics.verdict.verdict import MIN_CHECKPOINTS, MIN_GROUPS

SURFACE_FAMILIES = ("landscape", "curvature")  # computed every features.landscape_every-th checkpoint only
SURFACE_POINTS = 3  # finite points a level and a rate need (topometrics.analysis.predict.window_summary)

# The reasons verdict.scheme_problem gives (the report groups skipped rows by them).
TOO_FEW_CHECKPOINTS = re.compile(r"^fraction (\S+) observes at most (\d+) checkpoints per run; need (\d+)$")
TOO_FEW_GROUPS = re.compile(r"^leave-one-(\w+)-out needs at least (\d+) \w+, got (\d+)$")


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

    - a checkpoint every ``train.ckpt_every`` steps must give :data:`MIN_CHECKPOINTS` by the first fraction
      (step 0 counts): the largest divisor of ``train.steps`` that does;
    - some scheme needs :data:`MIN_GROUPS` groups: seeds are added after the largest until there are as many;
    - ``need_runs``: the runs a comparison needs to pass the corrected level (verdict ``not enough runs``):
      seeds are added until the declared runs reach it;
    - the loss-surface families' spacing (:func:`surface_remedy`).
    """
    train, fractions = params["train"], params["analysis"]["fractions"]
    steps, every, seeds = int(train["steps"]), int(train["ckpt_every"]), list(train["seeds"])
    settings = []
    cutoff = min(fractions) * steps
    spacing = cutoff // every + 1 < MIN_CHECKPOINTS
    if spacing:
        fits = [d for d in range(1, steps + 1) if steps % d == 0 and cutoff // d + 1 >= MIN_CHECKPOINTS]
        when = f"by {100 * min(fractions):g}% of training"
        if fits:
            settings.append((f"train.ckpt_every={max(fits)}", f"{MIN_CHECKPOINTS} checkpoints {when}"))
        else:
            settings.append((f"train.steps={steps * MIN_CHECKPOINTS}", f"enough steps for a checkpoint {when}"))
    groups = {"seed": len(seeds), "variant": 1 + len(params.get("variants") or {}), "rung": len(params["ladder"])}
    per_seed = groups["variant"] * groups["rung"]
    wanted = max(MIN_GROUPS if max(groups.values()) < MIN_GROUPS else 0, -(-need_runs // per_seed))
    if wanted > len(seeds):
        more = seeds + [max(seeds) + i for i in range(1, wanted - len(seeds) + 1)]
        why = f"{wanted} seeds, {wanted * per_seed} runs: leave-one-seed-out"
        settings.append((f"'train.seeds=[{','.join(map(str, more))}]'", why))
    return settings + (surface_remedy(params) if not spacing else [])  # a new spacing changes the surface's


def surface_remedy(params: dict) -> list[tuple[str, str]]:
    """The ``features.landscape_every`` that gives the loss-surface families :data:`SURFACE_POINTS`
    checkpoints by the first fraction (step 0 counts), with why; empty when they have them, are switched off,
    or no spacing can give them (then the checkpoint rule of :func:`remedy` comes first)."""
    default = FeaturesParams()
    features = params.get("features") or {}
    if not set(SURFACE_FAMILIES) & set(features.get("families", default.families)):
        return []
    every, k = int(params["train"]["ckpt_every"]), int(features.get("landscape_every", default.landscape_every))
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
