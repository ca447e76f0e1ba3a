"""The learning-rate schedule: linear warm-up, then cosine decay to ``lr * min_lr_ratio`` at the last step.

Training sets the rate of every update from it, and the schedule-aware loss predictor reads the
same schedule (``topometrics.analysis.predict``), so both see exactly the same numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Schedule:
    """The recipe's schedule over ``steps`` updates (``warmup`` of them linear from 0)."""

    steps: int
    warmup: int
    lr: float = 1.0  # peak rate
    min_lr_ratio: float = 0.0  # the cosine ends at lr * min_lr_ratio

    @classmethod
    def from_recipe(cls, recipe: Mapping) -> Schedule:
        """From a recipe mapping with ``steps``, ``warmup``, ``lr`` and ``min_lr_ratio``."""
        return cls(int(recipe["steps"]), int(recipe["warmup"]), float(recipe["lr"]), float(recipe["min_lr_ratio"]))

    def rate(self, step) -> np.ndarray:
        """LR of update number ``step`` (1-based; an int or an array of them): ``lr * step / warmup``
        during the warm-up, then ``lr * (r + (1 - r) * (1 + cos(pi * progress)) / 2)``."""
        step = np.asarray(step, dtype=float)
        progress = np.clip((step - self.warmup) / (self.steps - self.warmup), 0.0, 1.0)
        cosine = self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + np.cos(np.pi * progress)))
        warm = self.lr * step / self.warmup if self.warmup > 0 else np.full_like(step, self.lr)
        return np.where(step <= self.warmup, warm, cosine)

    def at(self, step: int) -> float:
        """LR of update number ``step`` as a Python float."""
        return float(self.rate(step))
