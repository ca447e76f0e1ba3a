"""The execution seam: map a function over jobs (checkpoints), on this machine or on a Dask cluster.

:func:`map_jobs` (results in order) and :func:`each_result` (results as they complete, a failed job
as its exception) are the way the project runs work in parallel; callers pass the ``compute``
params through and never see a pool or a cluster. The one other pool, :func:`background_pool`, is
for work beside a loop that keeps running (the live monitor's measurements) and is made here too,
with the same workers. ``compute.cluster: local`` (the default) runs a
process pool here; an address or scheduler file runs the jobs on that Dask cluster
(``topometrics.execution.cluster``, ``docs/scaling.md``). Jobs and results must pickle, and ``fn`` must be a
module-level function.
"""

from __future__ import annotations

import ast
import functools
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import torch
from threadpoolctl import threadpool_limits

from topometrics.execution.cluster import check_workers, connect, map_on_cluster
from topometrics.execution.lifeline import die_with
from topometrics.params_sources import ComputeParams

Job = TypeVar("Job")
Result = TypeVar("Result")

# A pool pays only with several jobs per worker (a worker's start costs about one small job).
MIN_JOBS_PER_WORKER = 4


def map_jobs(fn: Callable[[Job], Result], jobs: Sequence[Job], **where) -> list[Result]:
    """``[fn(job) for job in jobs]``, in order: :func:`each_result` (``where`` is its keywords
    ``workers``, ``label``, ``compute``) collected. The first failed job's exception is raised
    here, after the others have finished."""
    results = dict(each_result(fn, jobs, **where))
    ordered = [results[i] for i in range(len(jobs))]
    failed = next((r for r in ordered if isinstance(r, BaseException)), None)
    if failed is not None:
        raise failed
    return ordered


def each_result(
    fn: Callable[[Job], Result],
    jobs: Sequence[Job],
    *,
    workers: int,
    label: str,
    compute: ComputeParams | None = None,
    unit: str = "checkpoints",
) -> Iterator[tuple[int, Result | BaseException]]:
    """``(index, fn(jobs[index]))`` for every job as it completes, with progress on stderr; a
    failed job gives its exception (one failed job does not stop the others, and a caller can keep
    each result as soon as it arrives: a killed run keeps what finished).

    Parameters
    ----------
    fn : module-level function of one job
    jobs : the jobs, e.g. one per checkpoint
    workers : local processes to use; with 1, or fewer than ``MIN_JOBS_PER_WORKER`` jobs per worker,
        everything runs in this process. Not used on a cluster (its workers are its own).
    label : what the progress line calls the work (``features: 12/51 checkpoints, 3.0 s, 4.0/s, ETA 10 s``)
    compute : the ``compute`` params; None or ``cluster: local`` is this machine
    unit : what the progress line calls one job

    Notes
    -----
    Every job runs with one torch thread and one BLAS thread, in a worker or in this process, so
    results do not depend on ``workers`` (multi-threaded BLAS on the small matrices here was 5-20x
    slower on a busy 2-core machine). Workers come from a fork server that imports ``fn``'s module
    (torch, scipy, ripser) once and forks a ready worker per slot: spawned workers each paid the
    ~3-4 s import and another ~1 s to exit. Not plain fork of this process: forking a process that
    has run torch (OpenMP) threads can deadlock; the fork server only imports, so torch has started
    no threads there. spawn where there is no fork server (Windows). Workers die with the calling
    process even when it is SIGKILLed (topometrics.execution.lifeline), and with them the fork server and the
    resource tracker. On a Dask cluster the connection is made, and a first worker awaited, before
    any job is submitted (:func:`topometrics.execution.cluster.connect`: an unreachable address is a
    one-line error naming it); a job whose workers all died is a
    :class:`topometrics.execution.cluster.CheckpointJobError` (``WorkerLost``, ``WorkerOutOfMemory``).
    """
    progress = _Progress(len(jobs), label, unit)
    if compute is not None and compute.cluster != "local":
        with connect(compute.cluster, compute.security, compute.connect_timeout_s) as client:
            for i, result in map_on_cluster(client, functools.partial(_in_one_thread, fn), list(jobs)):
                progress.step()
                yield i, result
    else:
        with _executor(fn, workers, len(jobs)) as pool:
            yield from _local_results(pool, fn, jobs, progress)
    progress.close()


@contextmanager
def whole_job_executor(
    compute: ComputeParams | None,
    workers: int,
    initializer: Callable,
    initargs: tuple,
    *,
    visible: Sequence[Path] = (),
    resources: dict[str, float] | None = None,
) -> Iterator[Executor]:
    """Where whole jobs run (training runs: minutes each, one submitted per run): a
    :class:`concurrent.futures.Executor` the caller submits to and waits on as usual.

    ``compute.cluster: local`` (or None): ``workers`` spawned processes here, each first running
    ``initializer(*initargs)`` (spawn: CUDA-safe, and no torch state inherited from this process). A Dask
    cluster: its executor (jobs are tasks, ``pure=False``, each declaring ``resources``, e.g.
    ``{"GPU": 0.25}`` for four runs per GPU worker); the initializer is not run there, so a job sets its own
    threads. Before any job, every worker of the cluster must see each path of ``visible`` (the workspace
    the jobs read and write: a shared filesystem) and, with ``resources``, some worker must declare each
    one (:func:`topometrics.execution.cluster.check_workers`: one-line errors naming the path or resource).
    A worker that dies mid-job has its job run again on another (Dask's ``allowed-failures``).
    """
    if compute is None or compute.cluster == "local":
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, context, initializer, initargs) as pool:
            yield pool
        return
    with connect(compute.cluster, compute.security, compute.connect_timeout_s) as client:
        check_workers(client, compute.cluster, [Path(p).resolve() for p in visible], resources or {})
        yield client.get_executor(pure=False, resources=resources)


def usable_cores() -> int:
    """Cores this process may run on (the affinity mask, not the machine's total)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def job_print(line: str) -> None:
    """Print one progress line of a job where its caller sees it: stdout here or in a local worker, the
    client's stdout when the job runs on a Dask worker (``distributed.print`` forwards it)."""
    try:
        from distributed import get_worker

        get_worker()
    except (ImportError, ValueError):  # not in a Dask task
        print(line, flush=True)
        return
    from distributed import print as forwarded

    forwarded(line, flush=True)


def _local_results(pool: ProcessPoolExecutor | None, fn: Callable, jobs: Sequence, progress) -> Iterator:
    if pool is None:
        for i, job in enumerate(jobs):
            try:
                result = fn(job)
            except Exception as err:  # noqa: BLE001 - a job's failure is its result, as in the pool
                result = err
            progress.step()
            yield i, result
        return
    futures = {pool.submit(fn, job): i for i, job in enumerate(jobs)}  # one job per task: load balance
    for future in as_completed(futures):
        progress.step()
        error = future.exception()
        yield futures[future], future.result() if error is None else error


def _in_one_thread(fn: Callable, job):
    """``fn(job)`` with one torch and one BLAS thread, as in a local worker (so results match)."""
    with one_thread():
        return fn(job)


@contextmanager
def _executor(fn: Callable, workers: int, jobs: int) -> Iterator[ProcessPoolExecutor | None]:
    if workers <= 1 or jobs < MIN_JOBS_PER_WORKER * workers:
        with one_thread():
            yield None
        return
    context = _pool_context(fn.__module__)
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_init, initargs=(os.getpid(),)) as pool:
        yield pool


def background_pool(fn: Callable) -> ProcessPoolExecutor:
    """One worker process for ``fn``'s jobs, submitted while the caller's own loop runs on (the live
    monitor's measurements while training).

    The worker is :func:`each_result`'s: forked from a fork server that preloads ``fn``'s module (spawn
    where there is none), one torch and one BLAS thread (it shares the machine with the loop it must not
    slow down; not a lower priority either: on a machine the loop fills, the worker would then fall
    behind), and it dies with this process. The caller submits to it and shuts it down.

    Called from a script's top level outside ``if __name__ == "__main__":`` (:func:`unguarded_main_line`) it
    exits with one line saying what to add (``SystemExit``, no traceback: the script itself must change):
    the worker would re-run the script, its training included, and the pool would break with a ~100-line
    traceback and nothing measured.
    """
    line = unguarded_main_line()
    if line is not None:
        raise SystemExit(
            f"error: {line}: a worker process re-imports this script and would run it again; put the code "
            f'that trains (from this line on) under `if __name__ == "__main__":` and run it again'
        )
    context = _pool_context(fn.__module__)
    return ProcessPoolExecutor(1, mp_context=context, initializer=_worker_init, initargs=(os.getpid(),))


def unguarded_main_line() -> str | None:
    """``<script>:<line>`` of the ``__main__`` script's top-level line that is running now, when that line is
    not inside an ``if __name__ == "__main__":`` block; None otherwise (guarded, an interactive session or a
    notebook with no script file, a script whose source cannot be read).

    A ``forkserver`` or ``spawn`` worker imports the main script as ``__mp_main__``: what runs unguarded runs
    again in the worker, where starting a process is refused."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "<module>" and frame.f_globals is vars(main)):
        frame = frame.f_back
    if frame is None or path is None:
        return None
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    guarded = any(
        isinstance(node, ast.If) and _is_main_test(node.test) and node.lineno <= frame.f_lineno <= node.end_lineno
        for node in tree.body
    )
    return None if guarded else f"{path}:{frame.f_lineno}"


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either side)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and any(
        isinstance(s, ast.Constant) and s.value == "__main__" for s in sides
    )


def _worker_init(caller: int) -> None:
    die_with(caller)  # a SIGKILLed caller leaves no workers (nor, then, fork server and resource tracker)
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
def one_thread():
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

    def __init__(self, total: int, label: str, unit: str = "checkpoints") -> None:
        self.total, self.label, self.unit, self.done, self.start = total, label, unit, 0, time.monotonic()
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
            rate = self.done / max(elapsed, 1e-9)
            eta = f", ETA {(self.total - self.done) / rate:.0f} s" if self.done < self.total else ""
            print(f"{self.label}: {self.done}/{self.total} {self.unit}, {elapsed:.1f} s, {rate:.2f}/s{eta}",
                  file=sys.stderr, flush=True)  # fmt: skip

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
