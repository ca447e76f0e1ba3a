"""Tests of topometrics.models.lr_schedule: warm-up and cosine by hand, scalar and array forms the same numbers."""

import math

import numpy as np
import pytest

from topometrics.models.lr_schedule import Schedule


def by_hand(step: int, steps: int, warmup: int, lr: float, floor: float) -> float:
    """The recipe in plain Python floats (the trainer's arithmetic before there was one schedule)."""
    if step <= warmup:
        return lr * step / warmup
    progress = (step - warmup) / (steps - warmup)
    return lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def test_warms_up_linearly_then_follows_a_cosine_to_the_floor():
    s = Schedule(1000, 100, 1.0)
    assert s.at(50) == pytest.approx(0.5)
    assert s.at(100) == pytest.approx(1.0)
    assert s.at(550) == pytest.approx(0.5)
    assert s.at(1000) == pytest.approx(0.0, abs=1e-12)
    assert s.at(100 + 900 // 3) == pytest.approx(0.5 * (1 + math.cos(math.pi / 3)))
    assert Schedule(1000, 100, 2.0, 0.1).at(1000) == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("steps", "warmup", "lr", "floor"), [(5000, 200, 3e-3, 0.0), (40, 2, 3e-3, 0.1), (600, 7, 1.0, 0.5)]
)
def test_scalar_and_array_forms_give_the_plain_python_numbers_exactly(steps, warmup, lr, floor):
    schedule = Schedule(steps, warmup, lr, floor)
    t = np.arange(1, steps + 1)
    expected = np.array([by_hand(int(i), steps, warmup, lr, floor) for i in t])
    np.testing.assert_array_equal(schedule.rate(t), expected)
    assert [schedule.at(int(i)) for i in t[:: max(1, steps // 50)]] == expected[:: max(1, steps // 50)].tolist()


def test_from_recipe_and_no_warmup():
    recipe = {"steps": 100, "warmup": 0, "lr": 0.5, "min_lr_ratio": 0.0, "seed": 1}
    s = Schedule.from_recipe(recipe)
    assert s == Schedule(100, 0, 0.5, 0.0)
    assert s.at(0) == 0.5 and s.at(100) == pytest.approx(0.0, abs=1e-15)
