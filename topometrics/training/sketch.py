"""The trajectory sketch: a seeded Johnson-Lindenstrauss projection of a run's whole parameter vector, recorded
while it trains, so its trajectory's shape (e.g. its PH dimension) can be measured after the run.

:class:`SketchRecorder` is an observer of the training loop (:class:`topometrics.training.train.Observer`):
every ``every`` steps it projects the parameters (all of them, in ``named_parameters`` order, flattened and
concatenated: ``theta``, ``D`` numbers) to ``sketch = theta @ P`` (``dim`` numbers), ``P`` the package's
sparse JL matrix of ``seed`` (:func:`topometrics.measures.projection.project`: ``(D, dim)``, 8 nonzeros
``+-1/sqrt(8)`` a row from a counter-based generator keyed by the seed, never materialised and touching no
global generator: the run's files are the same with or without it). The same seed and model shape give the
same ``P``, so the sketches of every run of a shape live in one space. It is an observation only: not in the
recipe fingerprint, and nothing it does reaches the run. The weights are copied to the CPU for it (on a GPU,
one ``D``-float copy per sketched step).

**The file** (:data:`SKETCH_FILE` in the run directory): CSV, header ``step,s0,...,s{dim-1}``, one row per
sketched step, appended and flushed row by row (a kill loses at most the row being written). A resumed run
is observed again at its resume step (:meth:`SketchRecorder.on_step` with ``loss=None``); the recorder then
keeps the rows before that step and its complete lines only, and writes the rest again: no gap, no
duplicate. The header names the dimension; a file of another dimension, seed or projection
(:data:`SKETCH_META`; files from before the sparse projection name none) is started over.
:func:`read_sketch` reads it back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from topometrics.atomic import write_text
from topometrics.measures.projection import PROJECTION, project

SKETCH_FILE = "trajectory_sketch.csv"
SKETCH_META = "trajectory_sketch.json"  # {"dim", "seed", "n_params", "projection"}: what the rows are a projection of


@torch.no_grad()
def sketch(model: torch.nn.Module, dim: int, seed: int) -> np.ndarray:
    """``theta @ P``: the model's parameters (``named_parameters`` order, flattened and concatenated, as float32
    on the CPU: one copy of the ``D`` weights) through the sparse JL matrix of ``seed``, ``(dim,)`` float64."""
    theta = torch.cat([p.detach().reshape(-1).to("cpu", torch.float32) for _, p in model.named_parameters()])
    return project(theta.numpy(), dim, seed)


class SketchRecorder:
    """Records the sketch of the weights every ``every`` steps into ``<run_dir>/`` :data:`SKETCH_FILE`.

    Nothing is held between steps but the file: the projection is drawn as it is applied
    (:mod:`topometrics.measures.projection`).
    """

    def __init__(self, run_dir: Path, dim: int = 64, every: int = 10, seed: int = 0) -> None:
        if dim <= 0 or every <= 0:
            raise ValueError(f"dim and every must be positive, got dim={dim}, every={every}")
        self.path, self.meta_path = Path(run_dir) / SKETCH_FILE, Path(run_dir) / SKETCH_META
        self.dim, self.every, self.seed = dim, every, seed
        self.file = None

    def on_step(self, model: torch.nn.Module, step: int, loss: float | None) -> None:
        if self.file is None:
            self._open(model, step)
        if step % self.every == 0:
            row = sketch(model, self.dim, self.seed)
            self.file.write(f"{step}," + ",".join(repr(float(v)) for v in row) + "\n")
            self.file.flush()  # a kill loses at most this row (and resume writes it again)

    def on_checkpoint(self, step: int, val_loss: float) -> None:
        pass

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    def _open(self, model: torch.nn.Module, start: int) -> None:
        """Open the file to append after the rows before ``start`` (the first step observed)."""
        n_params = sum(p.numel() for p in model.parameters())
        meta = {"dim": self.dim, "seed": self.seed, "n_params": n_params, "projection": PROJECTION}
        header = "step," + ",".join(f"s{i}" for i in range(self.dim)) + "\n"
        kept = rows_before(self.path, start) if _same_meta(self.meta_path, meta) else []
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_text(self.meta_path, json.dumps(meta) + "\n")
        write_text(self.path, header + "".join(kept))  # one rename: the old file or the new, never half
        self.file = self.path.open("a")


def rows_before(path: Path, step: int) -> list[str]:
    """The complete data lines (newline-terminated) of a sketch file whose step is below ``step``; [] without a file."""
    if not path.exists():
        return []
    lines = path.read_text().splitlines(keepends=True)[1:]
    return [line for line in lines if line.endswith("\n") and int(line.split(",", 1)[0]) < step]


def _same_meta(path: Path, meta: dict) -> bool:
    try:
        return json.loads(path.read_text()) == meta
    except (FileNotFoundError, json.JSONDecodeError):
        return False


def read_sketch(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """A run's sketched trajectory: steps ``(n,)`` int64 ascending and points ``(n, dim)`` float64; empty arrays
    (``(0,)``, ``(0, 0)``) when the run has no sketch. A torn last line (a kill mid-write) is left out."""
    path = Path(run_dir) / SKETCH_FILE
    if not path.exists():
        return np.empty(0, dtype=np.int64), np.empty((0, 0))
    lines = [line for line in path.read_text().splitlines(keepends=True)[1:] if line.endswith("\n")]
    if not lines:
        return np.empty(0, dtype=np.int64), np.empty((0, 0))
    table = np.array([[float(v) for v in line.split(",")] for line in lines])
    return table[:, 0].astype(np.int64), table[:, 1:]


@dataclass(frozen=True)
class TrajectorySketches:
    """The train stage's observer factory (:data:`topometrics.training.run_queue.ObserverFactory`): opens a run's
    :class:`SketchRecorder` in its run directory. Settings only (it is pickled into each run's process)."""

    dim: int
    every: int
    seed: int = 0

    def __call__(self, cfg, run_dir: Path) -> SketchRecorder:
        return SketchRecorder(Path(run_dir), self.dim, self.every, self.seed)
