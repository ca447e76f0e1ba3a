"""The execution seam: map a function over jobs (checkpoints), in worker processes or in this one.

:func:`map_jobs` is the only way the project runs work in parallel; callers never see a pool.
Jobs and results must pickle, and ``fn`` must be a module-level function.
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

import torch
from threadpoolctl import threadpool_limits

Job = TypeVar("Job")
Result = TypeVar("Result")

# A pool pays only with several jobs per worker (a worker's start costs about one small job).
MIN_JOBS_PER_WORKER = 4


def map_jobs(fn: Callable[[Job], Result], jobs: Sequence[Job], *, workers: int, label: str) -> list[Result]:
    """``[fn(job) for job in jobs]``, in order, on ``workers`` processes, with progress on stderr.

    Parameters
    ----------
    fn : module-level function of one job
    jobs : the jobs, e.g. one per checkpoint
    workers : processes to use; with 1, or fewer than ``MIN_JOBS_PER_WORKER`` jobs per worker,
        everything runs in this process
    label : what the progress line calls the work (``features: 12/51 checkpoints, 3.0 s``)

    Returns
    -------
    list
        The results in the order of ``jobs``. A job's exception is raised here.

    Notes
    -----
    Every job runs with one torch thread and one BLAS thread, in a worker or in this process, so
    results do not depend on ``workers`` (multi-threaded BLAS on the small matrices here was 5-20x
    slower on a busy 2-core machine). Workers come from a fork server that imports ``fn``'s module
    (torch, scipy, ripser) once and forks a ready worker per slot: spawned workers each paid the
    ~3-4 s import and another ~1 s to exit. Not plain fork of this process: forking a process that
    has run torch (OpenMP) threads can deadlock; the fork server only imports, so torch has started
    no threads there. spawn where there is no fork server (Windows).
    """
    progress = _Progress(len(jobs), label)
    with _executor(fn, workers, len(jobs)) as pool:
        # chunksize 1: jobs take 10 ms to seconds, so load balance beats saving IPC.
        results = (fn(job) for job in jobs) if pool is None else pool.map(fn, jobs)
        out = []
        for result in results:
            out.append(result)
            progress.step()
    progress.close()
    return out


@contextmanager
def _executor(fn: Callable, workers: int, jobs: int) -> Iterator[ProcessPoolExecutor | None]:
    if workers <= 1 or jobs < MIN_JOBS_PER_WORKER * workers:
        with _one_thread():
            yield None
        return
    context = _pool_context(fn.__module__)
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_init) as pool:
        yield pool


def _worker_init() -> None:
    torch.set_num_threads(1)
    threadpool_limits(1)


def _pool_context(preload: str) -> multiprocessing.context.BaseContext:
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    # Only read when the server starts (the first pool of this process); harmless later.
    context.set_forkserver_preload([preload])
    return context


@contextmanager
def _one_thread():
    """torch and BLAS on one thread, as in a worker (so results match), restored afterwards."""
    threads = torch.get_num_threads()
    try:
        with threadpool_limits(1):
            torch.set_num_threads(1)
            yield
    finally:
        torch.set_num_threads(threads)


class _Progress:
    """tqdm on a TTY, otherwise a plain stderr line about every 10% (CI and DVC logs)."""

    def __init__(self, total: int, label: str) -> None:
        self.total, self.label, self.done, self.start = total, label, 0, time.monotonic()
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=label, file=sys.stderr)

    def step(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
        elif self.done == self.total or self.done % max(1, self.total // 10) == 0:
            elapsed = time.monotonic() - self.start
            print(f"{self.label}: {self.done}/{self.total} checkpoints, {elapsed:.1f} s", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
