"""The learning-rate schedule: linear warm-up, then one of three shapes down to ``lr * min_lr_ratio``.

- ``cosine`` (the default): cosine decay from the end of the warm-up to the last step.
- ``wsd`` (warm-up, stable, decay): the peak rate until the last ``decay_fraction`` of the steps,
  then a linear decay to the floor at the last step.
- ``constant_decay``: the peak rate until the last ``decay_fraction`` of the steps, then a cosine
  decay to the floor over that tail (a constant LR with a late, smooth decay).

Training sets the rate of every update from it, and the schedule-aware loss predictors read the
same schedule (``topometrics.analysis.predict``), so both see exactly the same numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

SHAPES = ("cosine", "wsd", "constant_decay")
DEFAULT_SHAPE = "cosine"
DEFAULT_DECAY_FRACTION = 0.2  # the tail of a wsd / constant_decay schedule; unused by cosine


@dataclass(frozen=True)
class Schedule:
    """The recipe's schedule over ``steps`` updates (``warmup`` of them linear from 0)."""

    steps: int
    warmup: int
    lr: float = 1.0  # peak rate
    min_lr_ratio: float = 0.0  # the decay ends at lr * min_lr_ratio
    shape: str = DEFAULT_SHAPE  # one of SHAPES
    decay_fraction: float = DEFAULT_DECAY_FRACTION  # share of the steps in the decay tail (wsd, constant_decay)

    @classmethod
    def from_recipe(cls, recipe: Mapping) -> Schedule:
        """From a recipe mapping with ``steps``, ``warmup``, ``lr``, ``min_lr_ratio`` and optionally ``schedule``
        and ``decay_fraction`` (absent or None: the cosine of recipes written before the shapes existed)."""
        shape = recipe.get("schedule") or DEFAULT_SHAPE
        fraction = recipe.get("decay_fraction")
        fraction = DEFAULT_DECAY_FRACTION if fraction is None or fraction != fraction else float(fraction)
        args = (int(recipe["steps"]), int(recipe["warmup"]), float(recipe["lr"]), float(recipe["min_lr_ratio"]))
        return cls(*args, str(shape), fraction)

    @property
    def decay_start(self) -> int:
        """The last update at the peak rate before the decay: ``warmup`` for the cosine, else
        ``steps - round(decay_fraction * steps)`` (never before the warm-up ends)."""
        if self.shape == DEFAULT_SHAPE:
            return self.warmup
        return max(self.warmup, self.steps - int(round(self.decay_fraction * self.steps)))

    def rate(self, step) -> np.ndarray:
        """LR of update number ``step`` (1-based; an int or an array of them): ``lr * step / warmup``
        during the warm-up; then with ``p`` the progress through the decay (0 at :attr:`decay_start`,
        1 at ``steps``) ``lr * (r + (1 - r) * (1 + cos(pi * p)) / 2)`` (cosine, constant_decay) or
        ``lr * (r + (1 - r) * (1 - p))`` (wsd), ``r = min_lr_ratio``."""
        if self.shape not in SHAPES:
            raise ValueError(f"schedule shape {self.shape!r} is not one of {SHAPES}")
        step = np.asarray(step, dtype=float)
        start = self.decay_start
        progress = np.clip((step - start) / max(self.steps - start, 1), 0.0, 1.0)
        r = self.min_lr_ratio
        if self.shape == "wsd":
            decayed = self.lr * (r + (1 - r) * (1 - progress))
        else:  # the cosine's expression exactly as before the shapes existed: default runs stay bit-identical
            decayed = self.lr * (r + (1 - r) * 0.5 * (1 + np.cos(np.pi * progress)))
        warm = self.lr * step / self.warmup if self.warmup > 0 else np.full_like(step, self.lr)
        return np.where(step <= self.warmup, warm, decayed)

    def at(self, step: int) -> float:
        """LR of update number ``step`` as a Python float."""
        return float(self.rate(step))
