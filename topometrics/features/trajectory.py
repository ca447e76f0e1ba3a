"""The ``trajectory`` rows of a checkpoint: the PH0 dimension of the run's iterates in a trailing window.

A per-run computation (it needs the iterates before the checkpoint), run beside the distances to the previous
checkpoint (``topometrics.features.run_shards``, its ``distances`` table). Two sets of iterates:

``traj_phdim``       the run's trajectory sketch (``topometrics.training.sketch``: a JL projection of all the
                     parameters every ``train.sketch_every`` steps), NULL with the reason for a run trained
                     without it and for an external series (which keeps only its checkpoints);
``traj_ckpt_phdim``  the checkpoints themselves as the iterates (their linear weights through a seeded JL
                     projection, :func:`checkpoint_iterates`): fewer points, so mostly NULL unless a run keeps
                     many checkpoints per window.

Both are :func:`topometrics.dynamics.phdim.trailing_dimension` at the checkpoint's step over the window
``(step - features.phdim_window, step]`` with ``features.phdim_sizes`` and ``features.phdim_alpha``; too few
iterates give NULL with the reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from topometrics.dynamics.phdim import trailing_dimension
from topometrics.landscape.gradients import jl_project
from topometrics.params import FeaturesParams
from topometrics.vocabulary import ALL

ITERATE_DIM = 64  # JL dimension of a checkpoint as an iterate (the sketch's default, train.sketch_dim)
NO_SKETCH = "no trajectory sketch in the run directory (trained with train.sketch_every = 0, or an external series)"


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


def checkpoint_iterates(steps: Iterable[int], weights: Iterable[Iterable[np.ndarray]], seed: int) -> Iterates:
    """Checkpoints as iterates: each checkpoint's linear weights (arrays in network order), flattened,
    concatenated and projected to :data:`ITERATE_DIM` dimensions by the same seeded Gaussian matrix
    (:func:`topometrics.landscape.gradients.jl_project`), so distances between checkpoints are kept."""
    rows = [
        jl_project((np.asarray(w, np.float32).reshape(1, -1) for w in layers), ITERATE_DIM, seed)[0]
        for layers in weights
    ]
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
