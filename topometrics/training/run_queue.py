"""Train many runs at once: a queue of runs over a pool of processes that fills the machine.

On a CPU the work of one small run is real (one model with a 5x larger batch is no faster than
five runs), so the gain is in scheduling: one process per usable core, one torch thread each,
the longest runs first (longest-processing-time order keeps the last core from idling while one
long run finishes alone). On CUDA several processes share each GPU, because one tiny model
leaves it mostly idle.

Every run keeps :func:`topometrics.training.train.train_run`'s guarantees: a run directory whose
recipe fingerprint matches and whose last checkpoint is the final step is *complete* and is
skipped without touching a file; an unfinished one resumes from its last checkpoint, bit-identical
to an uninterrupted run (one thread per process, whatever the number of processes). A run that
diverges stops alone with its message; the others go on. Progress: a line per checkpoint of
every run (``[<run>] step ...``) and an overall line per finished run and every ``progress_s``.

Observers: the factories in ``observers`` (:data:`ObserverFactory`, picklable) open, in each run's
own process, the observers that watch it train (:class:`topometrics.training.train.Observer`); the train stage
passes :class:`topometrics.features.monitor.RunMonitors` when ``train.monitor_every`` > 0. The queue knows
nothing of what they compute. What it does read is a live monitor's log in a run directory, through
:mod:`topometrics.training.monitor_log` (no measure): its latest measurement goes into the run's metrics JSON
(``monitor``) at the end, and with a ``live`` folder every run's checkpoint losses and monitor
measurements are relayed into it through dvclive while the runs train
(:class:`topometrics.training.live_relay.LiveRelay`), so ``dvc exp show`` and ``dvc plots show`` show them live.

Why over 400 lines: the queue's plan (pool, order), its resume test and its reports are one promise (every
declared run ends complete, whatever killed it), and they share the run's files (:class:`RunFiles`).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from topometrics.atomic import write_text
from topometrics.errors import NO_SPACE, TopometricsError, disk_full
from topometrics.execution.cluster import LOCAL, ClusterError, describe
from topometrics.execution.compute import job_print, usable_cores, whole_job_executor
from topometrics.execution.lifeline import die_with
from topometrics.models.checkpoints import CheckpointError, list_checkpoints, verify_checkpoint
from topometrics.models.model import GPT, count_parameters, device_kind
from topometrics.models.tokens import load_tokens, read_record, token_bytes, tokenizer_sha256, vocab_size
from topometrics.params import Params, ParamsError
from topometrics.params_sources import ComputeParams
from topometrics.training.live_relay import LiveRelay
from topometrics.training.monitor_log import MONITOR_DIR, latest_measurement
from topometrics.training.progress import StepRate, finished_line, overall_line
from topometrics.training.run_dir import checked_steps, trained_tokenizers
from topometrics.training.train import (
    Observer,
    RunConfig,
    load_run_config,
    recipe_fingerprint,
    train_run,
    write_checkpoint_table,
)

GPU_RUNS_PER_DEVICE = 4  # concurrent runs per GPU when train.workers is 0 (tiny models are launch-bound)


class RunObserver(Observer, Protocol):
    """An observer of one run the queue trains, closed when the run ends."""

    def close(self) -> None:
        """Finish (e.g. wait for work still in flight); called however training ends."""


# Opens the observer of one run from its config and run directory, in that run's process: it is pickled
# (settings only, e.g. a frozen dataclass with __call__ such as topometrics.features.monitor.RunMonitors).
ObserverFactory = Callable[[RunConfig, Path], RunObserver]


@dataclass(frozen=True)
class RunFiles:
    """Where one run's outputs go: its run directory, its metrics JSON and its loss-curve CSV."""

    config: RunConfig
    run_dir: Path
    metrics: Path
    curve: Path


@dataclass(frozen=True)
class Pool:
    """How the queue uses the machine: processes at once, torch threads each, device per process."""

    workers: int
    threads: int
    devices: tuple[str, ...]  # one per process, round-robin over the processes (a run takes its process's)
    compute: ComputeParams | None = None  # compute.cluster names a Dask cluster: the runs are its tasks
    resources: dict[str, float] | None = None  # what each run's task declares there (a share of a GPU)

    def describe(self) -> str:
        where = ", ".join(sorted(set(self.devices)))
        if self.compute is not None and self.compute.cluster != LOCAL:
            return f"the Dask cluster at {describe(self.compute.cluster)} ({self.threads} thread(s) per run, {where})"
        return f"{self.workers} processes x {self.threads} thread(s) on {where}"


def plan_pool(device: str, workers: int, threads: int, n_runs: int, compute: ComputeParams | None = None) -> Pool:
    """The pool for ``n_runs`` runs under params ``train.device/workers/threads`` (0 = automatic).

    CPU: one process per usable core, one thread each. CUDA: ``GPU_RUNS_PER_DEVICE`` processes per
    visible GPU, runs spread over the GPUs. Never more processes than runs. On a Dask cluster
    (``compute.cluster``) every run is a task and the device is the worker's: ``cuda`` declares
    ``1 / GPU_RUNS_PER_DEVICE`` of a ``GPU`` resource (``dask worker --resources GPU=1`` takes that many runs
    at once), ``auto`` takes the worker's GPU when it has one, ``cpu`` its CPU; ``train.workers`` is not used.
    """
    if compute is not None and compute.cluster != LOCAL:
        gpu = {"GPU": 1 / GPU_RUNS_PER_DEVICE} if device == "cuda" else None
        return Pool(n_runs, threads or 1, (device,), compute, gpu)
    if device_kind(device) == "cuda":
        gpus = max(1, torch.cuda.device_count())
        devices = tuple(f"cuda:{i}" for i in range(gpus))
        auto = GPU_RUNS_PER_DEVICE * gpus
    else:
        devices, auto = ("cpu",), usable_cores()
    return Pool(max(1, min(workers or auto, n_runs)), threads or 1, devices)


def estimated_flops(cfg: RunConfig, from_step: int = 0) -> float:
    """Training FLOPs left after ``from_step``: 6 per parameter per token plus attention's
    6 * layers * context * hidden per token (Kaplan et al. 2020, C = 6N + attention). Orders the queue,
    longest first, and weighs each run's steps in the progress line's ETA."""
    m, r = cfg.model, cfg.recipe
    per_token = 6 * count_parameters(GPT(m)) + 6 * m.layers * m.context * m.hidden
    return per_token * r.batch_size * m.context * max(0, r.steps - from_step)


def run_progress(cfg: RunConfig, run_dir: Path, corpus_sha256: str, tokenizer: str | None = None) -> int:
    """The last checkpoint step of a run directory made with this recipe and corpus (0: new or stale).

    Read from the checkpoints' sidecars (cheap: names, then one small JSON file); training itself
    verifies every file before it resumes.
    """
    steps = sorted((int(p.stem[5:]) for p in Path(run_dir).glob("step_*.json") if p.stem[5:].isdigit()), reverse=True)
    if not steps:
        return 0
    try:
        meta = json.loads((Path(run_dir) / f"step_{steps[0]:06d}.json").read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return 0  # damaged: training names it and recomputes it
    return steps[0] if meta.get("recipe_fingerprint") == recipe_fingerprint(cfg, corpus_sha256, tokenizer) else 0


def is_complete(cfg: RunConfig, run_dir: Path, corpus_sha256: str, tokenizer: str | None = None) -> bool:
    """The run reached its last step with this recipe and corpus, its checkpoint table (written
    last) says so, and every checkpoint is whole, unchanged and this run's (header, size, the sha256 its
    sidecar records, and the sidecar's run, recipe and step: :func:`topometrics.models.checkpoints.verify_checkpoint`,
    which records the hash of a sidecar written before hashes), and so is any other step file the directory
    holds: nothing to do. A damaged, changed, missing or another run's checkpoint sends the run to training,
    which names it and recomputes it."""
    table = Path(run_dir) / "checkpoints.csv"
    r = cfg.recipe
    if run_progress(cfg, run_dir, corpus_sha256, tokenizer) != r.steps or not table.exists():
        return False
    owner = cfg.owner(recipe_fingerprint(cfg, corpus_sha256, tokenizer))
    if any(verify_checkpoint(run_dir, step, owner) for step in checked_steps(run_dir, r.steps, r.ckpt_every)):
        return False
    return table.read_text().rstrip("\n").rsplit("\n", 1)[-1].startswith(f"{r.steps},")


def summary_of(run_dir: Path, cfg: RunConfig) -> dict:
    """The summary a finished run wrote (``summary.json``), or one rebuilt from its checkpoints."""
    path = Path(run_dir) / "summary.json"
    if path.exists():
        return json.loads(path.read_text())
    ckpts = list_checkpoints(run_dir)
    last = ckpts[-1].meta if ckpts else {}
    return {
        "rung": cfg.rung, "variant": cfg.variant, "seed": cfg.recipe.seed, "status": "complete",
        "n_params": count_parameters(GPT(cfg.model)), "checkpoints": len(ckpts), "final_step": last.get("step"),
        "final_val_loss": last.get("val_loss"), "final_train_loss": last.get("train_loss"),
        "tokens_per_s": None, "device": None,
    }  # fmt: skip


def write_reports(run: RunFiles, summary: dict, corpus_used: str) -> None:
    """The run's metrics JSON and loss-curve CSV (DVC metrics and plots), from its run directory."""
    for path in (run.metrics, run.curve):
        path.parent.mkdir(parents=True, exist_ok=True)
    write_checkpoint_table(run.run_dir, run.curve)
    monitored = latest_monitored(run.run_dir)
    body = summary | {"corpus": corpus_used} | ({"monitor": monitored} if monitored else {})
    write_text(run.metrics, json.dumps(body, indent=1, sort_keys=True) + "\n")


def latest_monitored(run_dir: Path) -> dict | None:
    """The last measurement of the run's monitor log (:func:`topometrics.training.monitor_log.latest_measurement`),
    if it has one (also when this queue did not monitor the run: the log stays with the run)."""
    folder = Path(run_dir) / MONITOR_DIR
    return latest_measurement(folder) if folder.is_dir() else None


# The device of this process of the local pool (None elsewhere: a Dask worker's runs take the device submitted).
_PROCESS_DEVICE: str | None = None


def process_devices(devices: Sequence[str], workers: int):
    """A queue of ``workers`` device slots, ``devices`` round-robin, that the local pool's processes take one
    each as they start: a process, not a run, holds a GPU, so each GPU has its share of processes whatever
    order the runs finish in (runs placed by their position in the queue piled up on one GPU when the runs
    before them on the other finished first)."""
    slots = multiprocessing.get_context("spawn").Queue()
    for i in range(workers):
        slots.put(devices[i % len(devices)])
    return slots


def _init_worker(threads: int, caller: int, slots=None) -> None:
    # A SIGKILLed train stage runs no cleanup: without this its training processes (0.9-2 GB each) and,
    # through them, their monitors' workers would train on. The features pool's lifeline, reused.
    global _PROCESS_DEVICE
    die_with(caller)
    torch.set_num_threads(threads)
    _PROCESS_DEVICE = None if slots is None else slots.get(timeout=60)


def _train_one(
    run: RunFiles,
    corpus_dir: Path,
    corpus_sha256: str,
    device: str,
    observe: Sequence[ObserverFactory],
    threads: int = 1,
) -> dict:
    """Worker: train or resume one run watched by the observers ``observe`` opens (each closed however
    training ends), then write its checkpoint table and summary into its run directory. Sets its own torch
    threads (a Dask worker runs no initializer); its lines reach the caller (``job_print``)."""
    torch.set_num_threads(threads)
    device = _PROCESS_DEVICE or device
    with contextlib.ExitStack() as opened:
        observers = []
        for factory in observe:
            observers.append(observer := factory(run.config, run.run_dir))
            opened.callback(observer.close)
        recipe = run.config.recipe
        observers.append(StepRate(run.config.name, recipe.steps, recipe.ckpt_every, log=job_print))
        record, val_ids = read_record(corpus_dir), load_tokens(corpus_dir, "val")
        summary = train_run(
            run.config,
            load_tokens(corpus_dir, "train"),
            val_ids,
            run.run_dir,
            corpus_sha256,
            device,
            log=job_print,
            progress_bar=False,
            observers=observers,
            tokenizer=tokenizer_sha256(record),
            token_bytes=token_bytes(corpus_dir, record, val_ids),
        )
    write_text(run.run_dir / "summary.json", json.dumps(summary, indent=1, sort_keys=True) + "\n")
    write_checkpoint_table(run.run_dir, run.run_dir / "checkpoints.csv")  # last (atomic): marks the run complete
    return summary


def check_tokenizer(runs: list[RunFiles], corpus_dir: Path, source: dict) -> None:
    """Before any work: the prepared ``tokenizer.json`` is the one recorded, every run config's vocabulary is
    the corpus's, and no run directory holds checkpoints of another tokenizer (a run never resumes onto one;
    its finished files are left as they are). Raises naming the file and the fix."""
    tok = tokenizer_sha256(source)
    if tok:
        token_bytes(Path(corpus_dir), source, np.zeros(0, dtype=np.uint16))  # checks tokenizer.json's sha256
    for r in runs:
        if r.config.model.vocab_size != vocab_size(source):
            raise ParamsError(
                f"the config of {r.config.name} has vocab_size {r.config.model.vocab_size}, the prepared corpus "
                f"{vocab_size(source)}; run `dvc repro config` (it reads the corpus's vocabulary)"
            )
        if other := sorted(trained_tokenizers(r.run_dir) - {tok or "char"}):
            raise CheckpointError(
                f"{r.run_dir} holds checkpoints trained on {_tokenizer_words(other[0])}, but data.tokenizer now gives "
                f"{_tokenizer_words(tok or 'char')}; "
                f"move it away (e.g. mv {r.run_dir} {r.run_dir}-old) or set data.tokenizer back (nothing was changed)"
            )


def _tokenizer_words(tokenizer: str) -> str:
    return "characters" if tokenizer == "char" else f"the BPE whose tokenizer.json has sha256 {tokenizer[:12]}..."


def train_runs(
    runs: list[RunFiles],
    corpus_dir: Path,
    pool: Pool,
    progress_s: float = 30.0,
    log=print,
    observers: Sequence[ObserverFactory] = (),
    live: Path | None = None,
    live_s: float = 5.0,
) -> dict:
    """Train every run not yet complete over ``pool``, then write every run's metrics and curve.

    ``observers`` open, in each run's process, the observers of every run trained here (complete runs
    are not retrained to be observed).
    ``live``: a dvclive folder every run's losses and measurements are relayed into every ``live_s``
    seconds while training (complete runs' at the start), for ``dvc exp show`` and ``dvc plots``.

    Returns ``{run name: summary}``; a run whose process raised has ``status`` ``failed: <error>``
    (the others still finish). Complete runs are not touched: only their reports are written.
    """
    corpus_dir = Path(corpus_dir)
    source = read_record(corpus_dir)
    sha, tok = source["sha256"], tokenizer_sha256(source)
    check_tokenizer(runs, corpus_dir, source)
    done = {r.config.name: r for r in runs if is_complete(r.config, r.run_dir, sha, tok)}
    start = {r.config.name: run_progress(r.config, r.run_dir, sha, tok) for r in runs if r.config.name not in done}
    # One step's FLOPs per run (estimated_flops is linear in the steps left): the queue's order, longest first,
    # and the ETA's weights (the costly rungs train first, so a count of steps alike said 137 min left at 35 %
    # of a 60 min ladder).
    undone = [r for r in runs if r.config.name not in done]
    step_flops = {r.config.name: estimated_flops(r.config, r.config.recipe.steps - 1) for r in undone}
    left = {r.config.name: step_flops[r.config.name] * (r.config.recipe.steps - start[r.config.name]) for r in undone}
    todo = sorted(undone, key=lambda r: -left[r.config.name])
    summaries = {name: summary_of(r.run_dir, r.config) for name, r in done.items()}
    total_flops = sum(left.values())
    log(f"train: {len(runs)} runs, {len(done)} complete, {len(todo)} to train"
        + (f" on {pool.describe()}, longest first" if todo else ""))  # fmt: skip
    t0 = last_line = time.monotonic()
    relay = None
    if live:
        relay = LiveRelay(live, {r.config.name: (r.run_dir, recipe_fingerprint(r.config, sha, tok)) for r in runs})
        relay.poll()  # complete runs show at once
    if todo:
        for split in ("train", "val"):  # checked once here: a changed token file is one line, not one per run
            load_tokens(corpus_dir, split)
        observe, workers = tuple(observers), min(pool.workers, len(todo))
        for run in todo:
            run.run_dir.parent.mkdir(parents=True, exist_ok=True)
        corpus, parents = corpus_dir.resolve(), sorted({r.run_dir.parent.resolve() for r in todo})
        where = {"visible": [corpus, *parents], "resources": pool.resources}
        local = pool.compute is None or pool.compute.cluster == LOCAL
        init = (pool.threads, os.getpid(), process_devices(pool.devices, workers) if local else None)
        with whole_job_executor(pool.compute, workers, _init_worker, init, **where) as executor:
            futures: dict[Future, RunFiles] = {
                executor.submit(_train_one, replace(r, run_dir=r.run_dir.resolve()), corpus, sha,
                                pool.devices[i % len(pool.devices)], observe, pool.threads): r
                for i, r in enumerate(todo)  # the device here serves a Dask worker; a local process has its own
            }  # fmt: skip
            pending = set(futures)
            while pending:
                timeout = min(progress_s, live_s) if relay else progress_s
                finished, pending = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)
                if relay:
                    relay.poll()
                for future in finished:
                    run = futures[future]
                    if future.cancelled():  # only the cluster cancels: its scheduler is gone
                        raise ClusterError(_scheduler_gone(pool, len(summaries) - len(done), len(todo)))
                    summaries[run.config.name] = _outcome(future, run)
                    log(finished_line(run.config.name, summaries[run.config.name], len(summaries), len(runs), t0))
                    last_line = time.monotonic()
                if pending and time.monotonic() - last_line >= progress_s:
                    done = {r.config.name: run_progress(r.config, r.run_dir, sha, tok) for r in todo}
                    flops = sum(step_flops[n] * max(0, done[n] - start[n]) for n in done)
                    log(overall_line(flops, total_flops, len(summaries), len(runs), t0))
                    last_line = time.monotonic()
    if relay:
        relay.close()
    for run in runs:
        write_reports(run, summaries[run.config.name], source["used"])
    return summaries


@dataclass(frozen=True)
class TrainPaths:
    """The train stage's paths: run configs and corpus in; run directories, metrics, curves, dvclive out."""

    configs: Path  # one <run>.json per declared run (the config stage's output)
    corpus: Path  # the prepared corpus directory
    runs: Path  # parent of the run directories
    metrics: Path  # one <run>.json of final losses and status per run
    curves: Path  # one <run>.csv of validation loss per checkpoint per run
    live: Path | None = None  # the dvclive folder the runs are relayed into while they train


def train_declared(
    params: Params, paths: TrainPaths, only: Sequence[str] = (), observers: Sequence[ObserverFactory] = (), log=print
) -> dict:
    """Train every run ``params`` declares (or the ``only`` ones) on the pool ``params.train`` plans.

    Raises :class:`ParamsError` for an undeclared name in ``only`` (before any work) and, once every run
    has ended, :class:`TopometricsError` naming the runs that failed or stopped on a user's mistake.
    """
    names = params.run_names()
    if unknown := [n for n in only if n not in names]:
        raise ParamsError(f"--run {unknown[0]} is not declared in params.yaml; runs are {', '.join(names)}")
    runs = [
        RunFiles(load_run_config(paths.configs / f"{n}.json"), paths.runs / n, paths.metrics / f"{n}.json",
                 paths.curves / f"{n}.csv")
        for n in only or names
    ]  # fmt: skip
    t = params.train
    pool = plan_pool(t.device, t.workers, t.threads, len(runs), params.compute)
    summaries = train_runs(runs, paths.corpus, pool, log=log, observers=observers, live=paths.live)
    bad = {n: s["status"] for n, s in summaries.items() if s["status"] != "complete"}
    log(f"train: {len(summaries) - len(bad)}/{len(summaries)} runs complete"
        + "".join(f"; {n}: {status}" for n, status in bad.items()))  # fmt: skip
    if mistakes := [f"{n}: {s['mistake']}" for n, s in summaries.items() if s.get("mistake")]:
        raise TopometricsError("; ".join(mistakes))
    if failed := [n for n, status in bad.items() if status.startswith("failed")]:
        raise TopometricsError(f"{len(failed)} of {len(summaries)} runs failed ({', '.join(failed)}; see above)")
    return summaries


def _scheduler_gone(pool: Pool, finished: int, n_todo: int) -> str:
    where = describe(pool.compute.cluster) if pool.compute else "the cluster"
    return (
        f"the Dask scheduler at {where} went away; {finished} of {n_todo} runs to train had finished and are kept, "
        "the others resume from their last checkpoint on the next `dvc repro` (restart the scheduler first)"
    )


def _outcome(future: Future, run: RunFiles) -> dict:
    error = future.exception()
    if error is None:
        return future.result()
    if isinstance(error, OSError) and error.errno in NO_SPACE:  # a write outside topometrics.atomic (steps.csv)
        error = disk_full(error.filename or run.run_dir)
    # A user mistake (topometrics.errors) keeps its one-line message for the stage to print.
    mistake = {"mistake": str(error)} if isinstance(error, TopometricsError) else {}
    return {"rung": run.config.rung, "variant": run.config.variant, "seed": run.config.recipe.seed,
            "status": f"failed: {type(error).__name__}: {error}", "final_val_loss": None} | mistake  # fmt: skip
