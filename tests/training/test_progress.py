"""topometrics.training.progress: the queue's progress line and a run's step rate before its first checkpoint."""

import re
import time

import pytest

from tests.run_helpers import config
from tests.training.helpers import quiet
from topometrics.models.model import GPTConfig
from topometrics.training.run_queue import (
    estimated_flops,
)
from topometrics.training.train import Recipe, RunConfig, train_run


def test_the_progress_line_weighs_steps_by_their_cost():
    from topometrics.training.progress import overall_line

    cheap, costly = config(hidden=8, steps=40), config(hidden=48, layers=3, steps=40)
    per_step = {c: estimated_flops(c, 39) for c in (cheap, costly)}
    assert per_step[costly] * 40 == pytest.approx(estimated_flops(costly))  # one step's cost, times the steps
    # the costly run half trained, the cheap one not started: most of the compute is done, not a quarter
    done, total = per_step[costly] * 20, (per_step[costly] + per_step[cheap]) * 40
    line = overall_line(done, total, 0, 2, time.monotonic() - 60)
    share = done / total
    assert share > 0.45 and f"{share:.0%} of the compute to train" in line
    assert f"about {60 * (1 - share) / share / 60:,.1f} min left" in line


def test_a_run_whose_first_checkpoint_is_far_off_shows_its_rate_and_eta_before_it(tmp_path):
    """train.steps 1,000,000,000 (a checkpoint every 100,000,000): the queue's StepRate observer logs the steps/s
    and the hours to the next checkpoint and to the end long before any checkpoint (here: after 0.5 s)."""
    from tests.training.helpers import TRAIN, VAL
    from topometrics.training.progress import StepRate

    lines = []

    class Enough(Exception):
        pass

    class StopAfterTheLine:  # stops the billion-step run once the line is there
        def on_step(self, model, step, loss):
            if lines:
                raise Enough

        def on_checkpoint(self, step, val_loss):
            pass

    recipe = Recipe(10**9, 10**8, 8, 3e-3, 5, 0.0, 0.01, 1.0, 7, 8)
    cfg = RunConfig("big", GPTConfig(hidden=8, layers=1, heads=1, context=32), recipe)
    rate = StepRate("big", recipe.steps, recipe.ckpt_every, every_s=0.5, log=lines.append)
    with pytest.raises(Enough):
        train_run(cfg, TRAIN, VAL, tmp_path, "sha", "cpu", quiet, False, observers=[rate, StopAfterTheLine()])
    (line,) = lines
    assert re.fullmatch(
        r"\[big\] step [\d,]+/1,000,000,000, [\d,.]+ steps/s; checkpoint 100,000,000 in about [\d,.]+ h, "
        r"the end in about [\d,.]+ h",
        line,
    ), line
