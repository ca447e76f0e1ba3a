"""The verdict's two questions, each its own row (``level``):

- ``between``: does a family predict which recipe / size (rung x recipe cell) ends better, beyond the
  baseline? Every scheme of :mod:`topometrics.verdict.verdict`; the p permutes cells as blocks within
  their rung, the bounds take the cells as units, the pair-order accuracy counts pairs of different cells.
- ``within``: does it tell which *seed* of a cell ends better? Each cell's means are removed from the
  target and from every input (the recipe, constant in a cell, drops out), one-seed cells are left out,
  leave-one-seed-out (a run's seed rank in its cell), and the p shuffles the family among the seeds of each
  cell (:func:`topometrics.verdict.inference.within_cell_permutation`); pairs of the same cell are counted.

Pure functions over DataFrames and arrays.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

LEVELS = ("between", "within")
WITHIN_SCHEME = "seed"  # the within-cell rows' ``cv``: leave-one-seed-out, cell means removed
MIN_CHECKPOINTS = 4  # as topometrics.verdict.verdict's: observed checkpoints a run needs at a fraction


def cells(g: pd.DataFrame) -> pd.Series:
    """Each run's rung x recipe cell label: '<rung>|<variant>' ('base' where runs have no variant)."""
    variant = g["variant"].fillna("base").astype(str) if "variant" in g else pd.Series("base", index=g.index)
    return g["rung"].astype(str) + "|" + variant


def within_problem(g: pd.DataFrame, fraction: float) -> str | None:
    """Why no within-cell comparison can run at this fraction (None when it can): it needs 2 cells with 2 seeds."""
    seen = g["n_seen"].to_numpy(float) if "n_seen" in g else np.zeros(len(g))
    if len(g) == 0 or np.nanmax(seen, initial=0) < MIN_CHECKPOINTS:
        most = int(np.nanmax(seen, initial=0))
        return f"fraction {fraction:g} observes at most {most} checkpoints per run; need {MIN_CHECKPOINTS}"
    sizes = cells(g[seen >= MIN_CHECKPOINTS]).value_counts()
    if (sizes >= 2).sum() < 2:
        return f"the within-cell test needs 2 cells with >= 2 seeds, got {int((sizes >= 2).sum())}"
    return None


def within_cells(sub: pd.DataFrame, *arrays: np.ndarray):
    """The runs of cells with >= 2 seeds, each array less its cell's mean, and the CV groups: a run's seed rank
    in its cell (each fold holds out one seed of every cell)."""
    label = cells(sub)
    keep = (label.map(label.value_counts()) >= 2).to_numpy()
    sub, label = sub[keep].reset_index(drop=True), label[keep].to_numpy()
    centred = [centre(np.asarray(a, float)[keep], label) for a in arrays]
    groups = sub.groupby(label)["seed"].rank(method="first").to_numpy()
    return sub, centred, groups


def centre(a: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """``a`` (rows x ... ) less the mean of its cell's rows."""
    frame = pd.DataFrame(a.reshape(len(a), -1))
    return (frame - frame.groupby(cells).transform("mean")).to_numpy().reshape(a.shape)
