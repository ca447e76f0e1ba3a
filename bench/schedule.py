"""Helpers of ``bench train``: makespans of schedules of whole runs, the GEMM floor, pool start-up.

A schedule assigns whole runs (durations in seconds, measured with one thread while every core is
busy) to ``workers`` processes that each run one at a time; its makespan is the wall time of the
ladder. :func:`queue_makespan` is what ``topometrics.training.run_queue`` does (the queue's own order, each
run to the first free process); :func:`best_makespan` is the best any hand schedule of whole runs
can do (exhaustive over assignments), the reference the queue is compared with.
"""

from __future__ import annotations

import heapq
import itertools
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import torch

from topometrics.training.train import RunConfig


def queue_makespan(durations: list[float], workers: int) -> float:
    """Wall time of list scheduling: runs start in the given order on the first free process."""
    free = [0.0] * max(1, min(workers, len(durations)))
    for d in durations:
        heapq.heappush(free, heapq.heappop(free) + d)
    return max(free, default=0.0)


def parse_sweep(text: str) -> tuple:
    """``RUNGS:VARIANTS:SEEDS:STEPS[:CKPT_EVERY]`` (e.g. ``tiny,small,medium:4:8:1000:50``) -> (rungs, variants,
    seeds, steps, ckpt_every or None = the params' ``train.ckpt_every``)."""
    parts = text.split(":")
    rungs = tuple(r for r in parts[0].split(",") if r)
    try:
        numbers = tuple(int(x) for x in parts[1:])
    except ValueError:
        numbers = ()
    if len(parts) not in (4, 5) or not rungs or len(numbers) not in (3, 4) or min(numbers) < 1:
        raise ValueError(
            f"--sweep {text!r}: expected RUNGS:VARIANTS:SEEDS:STEPS[:CKPT_EVERY], e.g. tiny,small,medium:4:8:1000:50"
        )
    return (rungs, *numbers, None) if len(numbers) == 3 else (rungs, *numbers)


def sweep_projection(
    timing: dict[str, dict], sweep: tuple, ckpt_every: int, workers: int, startup_s: float = 0.0
) -> dict:
    """Wall time of training a sweep of rungs x variants x seeds runs of ``steps`` steps on ``workers`` processes.

    ``timing[rung]`` holds the measured ``step_s``, ``ckpt_s`` (one checkpoint) and ``extra_s`` (one-off) of a
    rung. ``sweep`` is :func:`parse_sweep`'s tuple; its ckpt_every (when not None) replaces ``ckpt_every``.
    A run costs steps x step_s + (steps // ckpt_every + 1) x ckpt_s + extra_s; variants are assumed to
    cost what the base recipe costs (they change the LR, its schedule or the weight decay, not the shape,
    batch or steps). Runs go longest first to the first free process (:func:`queue_makespan`), after
    ``startup_s`` of pool start-up.
    """
    rungs, variants, seeds, steps, every = sweep
    ckpt_every = every or ckpt_every
    run_s = {k: steps * timing[k]["step_s"] + (steps // ckpt_every + 1) * timing[k]["ckpt_s"] + timing[k]["extra_s"]
             for k in rungs}  # fmt: skip
    durations = sorted((run_s[k] for k in rungs for _ in range(variants * seeds)), reverse=True)
    return {
        "runs": len(durations),
        "rungs": list(rungs), "variants": variants, "seeds": seeds, "steps": steps, "ckpt_every": ckpt_every,
        "workers": workers,
        "run_minutes": {k: round(v / 60, 3) for k, v in run_s.items()},
        "wall_hours": round((startup_s + queue_makespan(durations, workers)) / 3600, 2),
        "run_hours_total": round(sum(durations) / 3600, 2),
    }  # fmt: skip


def best_makespan(durations: list[float], workers: int, limit: int = 2_000_000) -> float:
    """The shortest wall time of any assignment of whole runs to ``workers`` processes.

    Exhaustive (runs placed longest first; symmetric processes pruned) up to ``limit`` assignments,
    so exact for a ladder; beyond that the longest-first list schedule (within 4/3 of the optimum).
    """
    runs = sorted(durations, reverse=True)
    workers = max(1, min(workers, len(runs)))
    if workers ** len(runs) > limit:
        return queue_makespan(runs, workers)
    best = queue_makespan(runs, workers)
    for assignment in itertools.product(range(workers), repeat=len(runs)):
        if assignment and assignment[0] != 0:
            break  # the first run on process 0 covers every other case by symmetry
        loads = [0.0] * workers
        for d, w in zip(runs, assignment, strict=True):
            loads[w] += d
        best = min(best, max(loads))
    return max(best, max(runs, default=0.0))


def gemm_shapes(cfg: RunConfig) -> list[tuple[int, int, int, int]]:
    """The matrix products of one training step of ``cfg`` as (batch, rows, inner, cols).

    Per block the four linear layers (qkv, out, up, down) and the attention products (Q K^T and
    A V per batch x head), plus the tied output head; each forward product and its two backward
    products (input and weight gradients).
    """
    m, r = cfg.model, cfg.recipe
    tokens, h, t, d = r.batch_size * m.context, m.hidden, m.context, m.hidden // m.heads
    bh = r.batch_size * m.heads
    linear = [(h, 3 * h), (h, h), (h, 4 * h), (4 * h, h)] * m.layers + [(h, m.vocab_size)]
    shapes = []
    for k, n in linear:
        shapes += [(1, tokens, k, n), (1, tokens, n, k), (1, k, tokens, n)]
    for _ in range(m.layers):  # scores = Q K^T, out = A V, and their gradients
        shapes += [(bh, t, d, t), (bh, t, t, d), (bh, t, d, t)] * 2
    return shapes


def gemm_seconds_per_step(cfg: RunConfig, repeats: int = 5) -> float:
    """Seconds of :func:`gemm_shapes` timed alone in this process (median of ``repeats`` per shape)."""
    return sum(_time_bmm(shape, repeats) for shape in gemm_shapes(cfg))


def _time_bmm(shape: tuple[int, int, int, int], repeats: int) -> float:
    b, rows, inner, cols = shape
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(b, rows, inner, generator=gen), torch.randn(b, inner, cols, generator=gen)
    torch.bmm(x, y)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.bmm(x, y)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _ready(_: int = 0) -> int:
    import topometrics.training.train  # noqa: F401  (what a queue worker imports before its first run)

    return torch.get_num_threads()


def pool_startup_s(workers: int) -> float:
    """Seconds to start ``workers`` spawned processes and import the trainer in each (the queue's one-off)."""
    t0 = time.perf_counter()
    with ProcessPoolExecutor(workers, get_context("spawn")) as pool:
        list(pool.map(_ready, range(workers)))
    return time.perf_counter() - t0
