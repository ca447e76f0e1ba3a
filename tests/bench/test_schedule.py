"""bench train's schedule arithmetic: list scheduling, the best hand schedule, the GEMM floor."""

import pytest

from bench.schedule import (
    best_makespan,
    gemm_seconds_per_step,
    gemm_shapes,
    parse_sweep,
    queue_makespan,
    sweep_projection,
)
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


def test_a_sweep_projection_is_the_queue_over_every_run_of_the_grid():
    timing = {
        "a": {"step_s": 0.01, "ckpt_s": 0.5, "extra_s": 2.0},
        "b": {"step_s": 0.03, "ckpt_s": 1.0, "extra_s": 0.0},
    }
    out = sweep_projection(timing, (("a", "b"), 2, 3, 1000, None), ckpt_every=100, workers=4, startup_s=36.0)
    run_a, run_b = 1000 * 0.01 + 11 * 0.5 + 2.0, 1000 * 0.03 + 11 * 1.0  # 17.5 s and 41 s
    assert out["runs"] == 12 and out["run_minutes"] == {"a": round(run_a / 60, 3), "b": round(run_b / 60, 3)}
    # 6 runs of b then 6 of a over 4 processes: b b b b | b b on two, then a on the first free ...
    expected = queue_makespan([run_b] * 6 + [run_a] * 6, 4)
    assert out["wall_hours"] == round((36.0 + expected) / 3600, 2)
    assert out["run_hours_total"] == round((6 * run_a + 6 * run_b) / 3600, 2)
    assert parse_sweep("tiny,small:4:8:2000") == (("tiny", "small"), 4, 8, 2000, None)
    every_50 = sweep_projection(timing, parse_sweep("a:1:1:1000:50"), ckpt_every=100, workers=1)
    assert every_50["ckpt_every"] == 50 and every_50["run_minutes"]["a"] == round((10 + 21 * 0.5 + 2) / 60, 3)
    for bad in ("tiny:4:8", "tiny:4:x:100", ":4:8:100", "tiny:0:8:100", "tiny:1:1:1:1:1"):
        with pytest.raises(ValueError, match="RUNGS:VARIANTS:SEEDS:STEPS"):
            parse_sweep(bad)
