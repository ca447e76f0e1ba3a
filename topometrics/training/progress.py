"""Training's progress lines: a run's steps/s between far-apart checkpoints (:class:`StepRate`, an observer),
each finished run (:func:`finished_line`), and the queue's share of its compute with an ETA (:func:`overall_line`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from topometrics.models.model import GPT


@dataclass
class StepRate:
    """An observer of one run: when its checkpoints are far apart (a huge ``train.steps``), a line every ``every_s``
    between them with the steps/s and how long to the next checkpoint and to the end (the run's own lines come at
    checkpoints only)."""

    name: str
    steps: int
    ckpt_every: int
    every_s: float = 30.0
    log: Callable[[str], None] = print
    since: tuple[int, float] | None = None  # (step, time) this process started watching at
    shown: float = 0.0  # time of the last line or checkpoint

    def on_step(self, model: GPT, step: int, loss: float | None) -> None:
        now = time.monotonic()
        if self.since is None or step <= self.since[0]:
            self.since, self.shown = (step, now), now
        elif now - self.shown >= self.every_s:
            rate, upcoming = (step - self.since[0]) / (now - self.since[1]), min(self.steps, step + self.ckpt_every)
            upcoming -= upcoming % self.ckpt_every
            self.shown, hours = now, [(to - step) / rate / 3600 for to in (upcoming, self.steps)]
            self.log(f"[{self.name}] step {step:,}/{self.steps:,}, {rate:,.1f} steps/s; checkpoint {upcoming:,} in "
                     f"about {hours[0]:,.2f} h, the end in about {hours[1]:,.2f} h")  # fmt: skip

    def on_checkpoint(self, step: int, val_loss: float) -> None:
        self.shown = time.monotonic()


def finished_line(name: str, summary: dict, n_done: int, n_runs: int, t0: float) -> str:
    """One finished run (``summary``: its summary.json), its place in the queue and the time since ``t0``."""
    loss = summary.get("final_val_loss")
    loss_text = f"final val loss {loss:.4f}" if isinstance(loss, float) and math.isfinite(loss) else "no loss"
    stop = "" if summary["status"] == "complete" else "STOPPED, "
    return (
        f"train: [{n_done}/{n_runs}] {name}: {stop}{summary['status']}, {loss_text} "
        f"({time.monotonic() - t0:,.0f} s elapsed)"
    )


def overall_line(flops: float, total: float, n_done: int, n_runs: int, t0: float) -> str:
    """The queue's progress: the share of the training compute (:func:`estimated_flops`) done at the runs'
    last checkpoints (``topometrics.training.run_queue.estimated_flops``), minutes elapsed and, at that rate,
    left."""
    elapsed = time.monotonic() - t0
    eta = f", about {elapsed * (total - flops) / flops / 60:,.1f} min left" if flops > 0 else ""
    share = flops / total if total else 1.0
    return f"train: {n_done}/{n_runs} runs done, {share:.0%} of the compute to train ({elapsed / 60:,.1f} min{eta})"
