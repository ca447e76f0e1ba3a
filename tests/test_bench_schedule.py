"""bench train's schedule arithmetic: list scheduling, the best hand schedule, the GEMM floor."""

import pytest

from bench.schedule import best_makespan, gemm_seconds_per_step, gemm_shapes, queue_makespan
from topometrics.models.model import GPTConfig
from topometrics.training.train import Recipe, RunConfig


def test_the_queue_starts_runs_in_order_on_the_first_free_process():
    assert queue_makespan([3, 3, 2, 2, 2], 2) == 7  # 3 | 3, then 2 -> 5 | 3, 2 -> 5 | 5, 2 -> 7 | 5
    assert queue_makespan([5, 1, 1], 8) == 5 and queue_makespan([], 2) == 0


def test_the_best_hand_schedule_is_the_optimal_partition():
    assert best_makespan([3, 3, 2, 2, 2], 2) == 6  # 3 + 3 | 2 + 2 + 2 beats longest-first's 7
    assert best_makespan([10, 1, 1, 1], 2) == 10  # never below the longest run
    assert best_makespan([1.0] * 6, 3) == pytest.approx(2.0)


def test_the_gemm_floor_times_six_flops_per_weight_per_token_plus_attention():
    recipe = Recipe(10, 10, 8, 1e-3, 1, 0.0, 0.0, 1.0, 0, 8)
    cfg = RunConfig("t", GPTConfig(hidden=16, layers=2, heads=2, context=32), recipe)
    tokens, h, t, layers = 8 * 32, 16, 32, 2
    weights = layers * 12 * h * h + h * 128  # qkv 3h^2, out h^2, up and down 4h^2 each; the tied head
    attention = layers * 12 * 8 * t * t * h  # Q K^T and A V, forward and two gradients each, 2 flops per MAC
    flops = sum(2 * b * rows * inner * cols for b, rows, inner, cols in gemm_shapes(cfg))
    assert flops == 6 * tokens * weights + attention
    assert gemm_seconds_per_step(cfg, repeats=1) > 0
