"""The ``trajectory`` rows of a checkpoint: the PH0 dimension of the run's iterates in a trailing window.

A per-run computation (it needs the iterates before the checkpoint), run beside the distances to the previous
checkpoint (``topometrics.features.run_shards``, its ``distances`` table). Two sets of iterates:

``traj_phdim``       the run's trajectory sketch (``topometrics.training.sketch``: a JL projection of all the
                     parameters every ``train.sketch_every`` steps), NULL with the reason for a run trained
                     without it (:data:`NO_SKETCH`) and for an external series, which keeps only its
                     checkpoints (:data:`SERIES_SKETCH`);
``traj_ckpt_phdim``  the checkpoints themselves as the iterates (their linear weights through a seeded JL
                     projection, :class:`CheckpointIterate`): fewer points, so mostly NULL unless a run keeps
                     many checkpoints per window. The only one an external series (a run folder, hub
                     revisions) has. Each checkpoint's iterate is projected once, by the per-checkpoint path
                     ours and series share (``topometrics.features.checkpoint.linear_and_forward_features``,
                     as it reads the layers), and kept with its shard (``run_shards.shard_iterates``).

Both are :func:`topometrics.dynamics.phdim.trailing_dimension` at the checkpoint's step over the window
``(step - features.phdim_window, step]`` with ``features.phdim_sizes`` and ``features.phdim_alpha``; too few
iterates give NULL with the reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from topometrics.dynamics.phdim import trailing_dimension
from topometrics.measures.projection import project
from topometrics.params import FeaturesParams
from topometrics.vocabulary import ALL

ITERATE_DIM = 64  # JL dimension of a checkpoint as an iterate (the sketch's default, train.sketch_dim)
NO_SKETCH = "no trajectory sketch in the run directory (trained with train.sketch_every = 0)"
SERIES_SKETCH = "an external series keeps only its checkpoints: no trajectory sketch (traj_ckpt_phdim is from them)"


class Iterates(NamedTuple):
    """A trajectory's iterates: training steps ``(n,)`` ascending and points ``(n, d)``."""

    steps: np.ndarray
    points: np.ndarray


def window(iterates: Iterates | str, step: int, params: FeaturesParams) -> Iterates | str:
    """The iterates in ``(step - features.phdim_window, step]`` (what a checkpoint's job carries), or the reason."""
    if isinstance(iterates, str):
        return iterates
    inside = (iterates.steps > step - params.phdim_window) & (iterates.steps <= step)
    return Iterates(iterates.steps[inside], iterates.points[inside])


class CheckpointIterate:
    """A checkpoint as an iterate, built as its linear layers are read (in network order, one at a time):
    their weights flattened, concatenated and projected to :data:`ITERATE_DIM` dimensions by the sparse JL
    matrix of ``seed`` (:func:`topometrics.measures.projection.project`, each layer at its offset in the
    concatenation), the same matrix for every checkpoint of a shape, so distances between checkpoints are kept."""

    def __init__(self, seed: int) -> None:
        self.seed, self.offset, self.projected = seed, 0, None

    def add(self, weights: np.ndarray) -> None:
        """The next layer's weights (any shape; read before anything overwrites them)."""
        flat = np.asarray(weights).reshape(-1)
        self.projected = project(flat, ITERATE_DIM, self.seed, self.offset, self.projected)
        self.offset += flat.size

    def point(self) -> np.ndarray:
        """The iterate, (ITERATE_DIM,) float64."""
        if self.projected is None:
            raise ValueError("no layers added")
        return self.projected


def checkpoint_iterates(steps: Iterable[int], weights: Iterable[Iterable[np.ndarray]], seed: int) -> Iterates:
    """Checkpoints as iterates (:class:`CheckpointIterate`): ``weights`` holds each checkpoint's linear weights
    (arrays in network order)."""
    rows = []
    for layers in weights:
        iterate = CheckpointIterate(seed)
        for w in layers:
            iterate.add(w)
        rows.append(iterate.point())
    return Iterates(np.asarray(list(steps), dtype=np.int64), np.asarray(rows).reshape(len(rows), ITERATE_DIM))


def trajectory_values(
    sketch: Iterates | str, checkpoints: Iterates | str, step: int, params: FeaturesParams
) -> list[tuple[str, dict[str, float], str | None]]:
    """The family's ``layer='all'`` rows at ``step``: ``(layer, {feature: value}, reason)``."""
    out = []
    for name, iterates in (("traj_phdim", sketch), ("traj_ckpt_phdim", checkpoints)):
        if isinstance(iterates, str):
            out.append((ALL, {name: np.nan}, iterates))
            continue
        est = trailing_dimension(
            iterates.steps,
            iterates.points,
            step,
            params.phdim_window,
            params.phdim_sizes,
            params.phdim_alpha,
            params.seed,
        )
        out.append((ALL, {name: est.dimension}, est.reason))
    return out
