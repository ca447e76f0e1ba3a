"""bench train's schedule arithmetic: list scheduling, the best hand schedule, the GEMM floor."""

import pytest

from topometrics.bench.schedule import best_makespan, gemm_seconds_per_step, queue_makespan
from topometrics.model import GPTConfig
from topometrics.train import Recipe, RungConfig


def test_the_queue_starts_runs_in_order_on_the_first_free_process():
    assert queue_makespan([3, 3, 2, 2, 2], 2) == 7  # 3 | 3, then 2 -> 5 | 3, 2 -> 5 | 5, 2 -> 7 | 5
    assert queue_makespan([5, 1, 1], 8) == 5 and queue_makespan([], 2) == 0


def test_the_best_hand_schedule_is_the_optimal_partition():
    assert best_makespan([3, 3, 2, 2, 2], 2) == 6  # 3 + 3 | 2 + 2 + 2 beats longest-first's 7
    assert best_makespan([10, 1, 1, 1], 2) == 10  # never below the longest run
    assert best_makespan([1.0] * 6, 3) == pytest.approx(2.0)


def test_the_gemm_floor_grows_with_the_model():
    def cfg(hidden, layers):
        recipe = Recipe(10, 10, 8, 1e-3, 1, 0.0, 0.0, 1.0, 0, 8)
        return RungConfig("t", GPTConfig(hidden=hidden, layers=layers, heads=2, context=32), recipe)

    small, large = gemm_seconds_per_step(cfg(8, 1)), gemm_seconds_per_step(cfg(64, 4))
    assert 0 < small < large
