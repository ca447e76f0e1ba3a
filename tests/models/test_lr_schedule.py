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


def test_wsd_holds_the_peak_then_decays_linearly_to_the_floor():
    s = Schedule(100, 10, 2.0, 0.1, "wsd", 0.2)  # decay over updates 81..100
    assert s.decay_start == 80
    assert s.at(5) == pytest.approx(1.0) and s.at(10) == 2.0 and s.at(50) == 2.0 and s.at(80) == 2.0
    # progress p = (step - 80) / 20; rate = 2 * (0.1 + 0.9 * (1 - p))
    assert s.at(81) == pytest.approx(2.0 * (0.1 + 0.9 * 0.95))
    assert s.at(90) == pytest.approx(2.0 * (0.1 + 0.9 * 0.5))
    assert s.at(100) == pytest.approx(0.2)
    assert np.all(np.diff(s.rate(np.arange(80, 101))) < 0)


def test_constant_decay_holds_the_peak_then_follows_a_cosine_tail():
    s = Schedule(1000, 100, 1.0, 0.0, "constant_decay", 0.3)  # cosine over updates 701..1000
    assert s.decay_start == 700
    assert s.at(400) == 1.0 and s.at(700) == 1.0
    assert s.at(850) == pytest.approx(0.5)
    assert s.at(700 + 100) == pytest.approx(0.5 * (1 + math.cos(math.pi / 3)))
    assert s.at(1000) == pytest.approx(0.0, abs=1e-12)


def test_a_decay_tail_longer_than_the_stable_phase_starts_at_the_warmup_end():
    assert Schedule(100, 50, 1.0, 0.0, "wsd", 0.9).decay_start == 50
    assert Schedule(100, 50, 1.0, 0.0, "wsd", 0.9).at(75) == pytest.approx(0.5)


def test_the_default_shape_is_the_cosine_and_old_recipes_read_as_cosine():
    old = {"steps": 1000, "warmup": 100, "lr": 1.0, "min_lr_ratio": 0.0}
    assert Schedule.from_recipe(old) == Schedule(1000, 100, 1.0) == Schedule.from_recipe(old | {"schedule": None})
    wsd = Schedule.from_recipe(old | {"schedule": "wsd", "decay_fraction": 0.25})
    assert (wsd.shape, wsd.decay_fraction, wsd.decay_start) == ("wsd", 0.25, 750)
    # the decay fraction does not move a cosine
    t = np.arange(1, 1001)
    np.testing.assert_array_equal(Schedule(1000, 100, 1.0, 0.0, "cosine", 0.7).rate(t), Schedule(1000, 100).rate(t))
    with pytest.raises(ValueError, match="not one of"):
        Schedule(10, 1, 1.0, 0.0, "linear").rate(5)
