"""Topology while training runs: weight features every ``every`` steps, computed in the background.

:class:`TopologyMonitor` serves any PyTorch loop (``monitor.step(model, step, loss=...)``), our own
trainer as one of its observers (``on_step``/``on_checkpoint``, :class:`topometrics.training.train.Observer`;
the train stage opens one per run through :class:`RunMonitors`) and, through
:class:`TopologyCallback`, the Hugging Face ``Trainer``. At a measured step the linear weights
(:mod:`topometrics.models.architectures`) are copied to CPU float32 arrays; that copy is all the training
loop waits for. A worker process (:func:`topometrics.execution.compute.background_pool`) computes the weight
features of the copy and writes them (:func:`topometrics.features.monitor_measure.measure`) into the log
folder (:mod:`topometrics.training.monitor_log`, which names its files and reads them). When asked
(``surface``), every ``features.landscape_every``-th measurement also copies the whole model and computes
its loss surface (``landscape``, ``curvature``) in the same worker (:mod:`topometrics.features.monitor_surface`).

Optional early stopping follows Rieck et al. (2019), Algorithm 2, on NP (layer ``all``'s
``np_norm``, the mean over layers): :class:`NPPatience`. As results arrive in the background, the
decision comes one measurement or so after the step it is about.

Each finished measurement's layer-'all' values also go to the monitor's ``sinks`` (any callable
``sink(step, values)``; a sink that raises is reported once and training goes on). The callback adds one that
logs them through the Trainer's own ``log``, so every ``report_to`` integration (TensorBoard, W&B,
MLflow, dvclive, ...) receives them as ``topology/<feature>``.

The worker is started with the ``forkserver`` method (``spawn`` where there is none), whose worker re-runs
the script's top level: a monitor opened outside ``if __name__ == "__main__":`` is one line saying so
(:func:`topometrics.execution.compute.background_pool`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import TrainerCallback

from topometrics.execution import cost
from topometrics.execution.compute import background_pool
from topometrics.features.monitor_measure import Snapshot, measure
from topometrics.features.monitor_surface import SurfaceSource, due_batch, model_snapshot, state_bytes
from topometrics.landscape.surface import spilled_vectors
from topometrics.landscape.vectors import scratch_space
from topometrics.models.architectures import LinearLayer, module_layers
from topometrics.models.tokens import load_tokens
from topometrics.params import BASE_VARIANT, FeaturesParams, project_params
from topometrics.training.monitor_log import MONITOR_DIR, SHOWN, LiveLog, write_losses, write_stop


@dataclass(frozen=True)
class NPPatience:
    """NP early stopping (Rieck et al. 2019, Algorithm 2) after some measurements: the best NP so far
    (starting at 0), the step it was measured at, and the measurements since that did not improve on it."""

    best: float = 0.0
    best_step: int | None = None
    waited: int = 0

    def after(self, step: int, np_value: float, min_delta: float) -> NPPatience:
        """The state after one more measurement: a finite ``np_value`` above ``best + min_delta`` is an
        improvement; anything else (a NULL NP included) waits one more."""
        if np.isfinite(np_value) and np_value > self.best + min_delta:
            return NPPatience(float(np_value), step, 0)
        return replace(self, waited=self.waited + 1)


class TopologyMonitor:
    """Weight features of a training model every ``every`` steps, in a background process.

    Parameters
    ----------
    out_dir : Path
        The log folder, created at the first measurement or loss (so a monitor opened beside a
        run that then refuses to start leaves nothing behind). Parts already there (a resumed run)
        are kept; a re-measured step replaces its file.
    every : int
        Measure when ``step % every == 0``.
    params : FeaturesParams, optional
        The ``features`` params (as for checkpoints); None: the project's own
        (:func:`topometrics.params.project_params`).
    rung, seed : str, int
        The ``rung`` and ``seed`` columns of the rows (the series name the warehouse shows).
    patience : int, optional
        Enables NP early stopping: measurements without improvement before asking to stop.
    min_delta : float
        An improvement must beat the best NP by more than this.
    max_pending_bytes : int
        Bytes of snapshots allowed in flight (each waits in this process until the worker is done
        with it; a loss-surface step's snapshot holds the whole model too); a measured step whose
        snapshot would exceed it is skipped (and said so), so a slow measurement never makes training
        wait. One snapshot is always allowed. The default, 1 GiB, holds thousands of snapshots of a
        small model and one of a 1B model.
    live : bool
        Also log the layer-'all' values and the losses through dvclive into ``<out_dir>/dvclive``
        (:class:`topometrics.training.monitor_log.LiveLog`), e.g. inside ``dvc exp run`` with that folder
        declared in your ``dvc.yaml`` (docs/series.md).
    log : callable
        Receives one line per measurement.
    sink : callable, optional
        ``sink(step, values)`` after each finished measurement: the measured step and its layer-'all'
        values (feature -> float, finite ones only), e.g. your tracker's log call. More can be added to
        :attr:`sinks`. A sink that raises is named in one warning line (once) and training goes on.
    surface : SurfaceSource, optional
        Also the loss surface (``landscape`` and ``curvature`` rows, layer ``'all'``) at every
        ``features.landscape_every``-th measured step counted from step 0, on the fixed batch of the
        first ``features.landscape_batch`` validation windows of ``surface`` (the other measured steps:
        NULL with the reason); hundreds of forward+backward passes per due step, in the worker.
        Default None: weight features only. Our GPT and ``transformers`` models (rebuilt from their
        config, no remote code) are supported (:mod:`topometrics.features.monitor_surface`).
    """

    def __init__(
        self,
        out_dir: Path,
        every: int,
        params: FeaturesParams | None = None,
        rung: str = "live",
        seed: int = 0,
        patience: int | None = None,
        min_delta: float = 0.0,
        max_pending_bytes: int = 1 << 30,
        live: bool = False,
        log=print,
        sink: Callable[[int, dict[str, float]], object] | None = None,
        surface: SurfaceSource | None = None,
    ) -> None:
        if every <= 0:
            raise ValueError(f"every must be a positive number of steps, got {every}")
        if patience is not None and patience <= 0:
            raise ValueError(f"patience must be a positive number of measurements, got {patience}")
        self.out_dir, self.every = Path(out_dir), every
        self.params = params if params is not None else project_params().features
        self.rung, self.seed, self.patience, self.min_delta = rung, seed, patience, min_delta
        self.max_pending_bytes, self.log, self.surface = max_pending_bytes, log, surface
        self.layers: list[LinearLayer] | None = None
        self.pending: dict[int, tuple[Future, float, int]] = {}  # step -> (result, copy seconds, snapshot bytes)
        self.np_patience = NPPatience()
        self.stop_reason: str | None = None
        self.measured: list[int] = []
        self.skipped: list[int] = []
        self.sinks: list[Callable[[int, dict[str, float]], object]] = [] if sink is None else [sink]
        self._failed_sinks: set[int] = set()
        self._pool = background_pool(measure)
        # Start the worker now, beside the caller's own setup: the first start (the fork server
        # importing torch and the features) takes seconds the first measured step would otherwise wait.
        threading.Thread(target=_start_worker, args=(self._pool,), daemon=True).start()
        self._live = LiveLog(self.out_dir) if live else None

    # -- the training loop's side -------------------------------------------------------------

    def step(self, model: nn.Module, step: int, loss: float | None = None) -> bool:
        """Measure at multiples of ``every`` (copy the weights, queue the features); collect
        finished measurements. Returns True once early stopping asks the run to stop."""
        self.collect()
        if step % self.every:
            return self.should_stop
        if not self.measured and not self.pending and not self.skipped:  # the first measured step: say the cost
            self.log(f"monitor: {self.estimate_line(model)}")
        batch = None if self.surface is None else due_batch(self.surface, self.params, step, self.every)
        size = self.snapshot_bytes(model) + (state_bytes(model) if isinstance(batch, tuple) else 0)
        if self.pending and sum(nbytes for _, _, nbytes in self.pending.values()) + size > self.max_pending_bytes:
            self.skipped.append(step)
            self.log(f"monitor: step {step} not measured, {len(self.pending)} measurements still running")
            return self.should_stop
        start = time.perf_counter()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        snapshot, whole = self.snapshot(model), None if batch is None else model_snapshot(model, batch)
        future = self._pool.submit(measure, self.out_dir, snapshot, self.params, self.rung, self.seed, step, whole)
        self.pending[step] = (future, time.perf_counter() - start, size)
        if loss is not None:
            self.record_losses(step, train_loss=loss)
        return self.should_stop

    def estimate_line(self, model: nn.Module) -> str:
        """The cost of one measurement of ``model`` (:mod:`topometrics.execution.cost`): the weight families, and
        the loss surface when it is on, with what does not fit the available memory."""
        parameters, p = sum(t.numel() for t in model.parameters()), self.params
        families = [f for f in self.params.families if f in cost.GROUP]
        families += ["landscape", "curvature"] if self.surface is not None else []
        spilled = spilled_vectors(parameters, p.hessian_iters, p.hessian_top)
        probes = (p.hessian_probes, p.hessian_probes_max)
        costs = cost.checkpoint_costs(parameters, families, probes=probes, spilled=spilled)
        too_big = cost.unaffordable(costs, cost.available_bytes(), scratch=scratch_space())
        return cost.plan_line(parameters, costs) + "".join(f"; {f} will not fit: {why}" for f, why in too_big.items())

    def linear_layers(self, model: nn.Module) -> list[LinearLayer]:
        """The model's linear layers (:func:`topometrics.models.architectures.module_layers`), found once."""
        if self.layers is None:
            self.layers = module_layers(model)
        return self.layers

    def snapshot_bytes(self, model: nn.Module) -> int:
        """Bytes of one :meth:`snapshot` (float32 copies of the linear weights)."""
        return sum(4 * model.get_parameter(layer.tensor).numel() for layer in self.linear_layers(model))

    def snapshot(self, model: nn.Module) -> Snapshot:
        """CPU float32 copies of the linear weights as stored, with their orientation flag."""
        with torch.no_grad():
            return {
                layer.name: (
                    model.get_parameter(layer.tensor).detach().to("cpu", torch.float32, copy=True).numpy(),
                    layer.transposed,
                )
                for layer in self.linear_layers(model)
            }

    def record_losses(self, step: int, val_loss: float | None = None, train_loss: float | None = None) -> None:
        """Append the losses (nats) logged at a measured step (ignored at other steps)."""
        if step % self.every:
            return
        write_losses(self.out_dir, step, val_loss=val_loss, train_loss=train_loss)
        if self._live is not None:
            self._live.log(step, {"val_loss": val_loss, "train_loss": train_loss})

    @property
    def should_stop(self) -> bool:
        return self.stop_reason is not None

    # -- as an observer of topometrics.training.train (the train stage's runs) --------------------------

    def on_step(self, model: nn.Module, step: int, loss: float | None) -> None:
        """The weights after ``step``'s update (at step 0 the initial ones, at a resume step the resumed
        ones, whose loss is not known: None) and that step's batch loss."""
        self.step(model, step, loss=loss)

    def on_checkpoint(self, step: int, val_loss: float) -> None:
        """The validation loss of the checkpoint just written at ``step``."""
        self.record_losses(step, val_loss=val_loss)

    # -- results -------------------------------------------------------------------------------

    def collect(self, wait: bool = False) -> None:
        """Take finished measurements in step order: console line, early stopping, dvclive."""
        for step in sorted(self.pending):
            future, copy_s, _ = self.pending[step]
            if not (wait or future.done()):
                break  # keep step order: later results wait for earlier ones
            del self.pending[step]
            summary = future.result()
            self.measured.append(step)
            shown = " ".join(f"{k} {summary[k]:.4g}" for k in SHOWN if k in summary)
            surface_s = summary["_surface_seconds"]
            surface = f", of which loss surface {surface_s:.1f} s" if surface_s >= 0.05 else ""
            self.log(
                f"monitor: step {step} {shown} (copy {copy_s * 1000:.0f} ms, features {summary['_seconds']:.1f} s"
                f"{surface})"
            )
            if self._live is not None:
                self._live.log(step, {name: summary[name] for name in SHOWN if name in summary}, summary=True)
            self._to_sinks(step, summary)
            self._early_stopping(step, summary.get("np_norm", np.nan))

    def _to_sinks(self, step: int, summary: dict) -> None:
        values = {k: float(v) for k, v in summary.items() if not k.startswith("_") and np.isfinite(v)}
        for sink in self.sinks:
            try:
                sink(step, values)
            except Exception as err:  # noqa: BLE001 - a user's sink may raise anything; training must go on
                if id(sink) not in self._failed_sinks:
                    self._failed_sinks.add(id(sink))
                    name = getattr(sink, "__qualname__", type(sink).__name__)
                    self.log(
                        f"monitor: warning: sink {name} raised {type(err).__name__}: {err} at step {step}; "
                        f"training goes on, measurements still go to {self.out_dir} (further errors not shown)"
                    )

    def close(self) -> None:
        """Wait for every queued measurement, then stop the worker."""
        try:
            self.collect(wait=True)
        finally:
            self._pool.shutdown(wait=True)
            if self._live is not None:
                self._live.end()

    def __enter__(self) -> TopologyMonitor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _early_stopping(self, step: int, np_value: float) -> None:
        if self.patience is None or self.should_stop:
            return
        self.np_patience = state = self.np_patience.after(step, np_value, self.min_delta)
        if state.waited < self.patience:
            return
        best = f"{state.best:.4f} (step {state.best_step})" if state.best_step is not None else "0"
        self.stop_reason = (
            f"NP early stopping at step {step}: NP has not risen above {best} by more than "
            f"{self.min_delta} for {self.patience} measurements (Rieck et al. 2019, Algorithm 2)"
        )
        record = {"step": step, "reason": self.stop_reason, "best_np": state.best, "best_step": state.best_step}
        write_stop(self.out_dir, record)
        self.log(f"monitor: {self.stop_reason}")


class TopologyCallback(TrainerCallback):
    """A ``transformers.Trainer`` callback around :class:`TopologyMonitor`.

    Measures at ``on_step_end`` when ``global_step % every == 0``; the train loss (``on_log``) and
    eval loss (``on_evaluate``) logged at measured steps go to the losses log; early stopping
    sets ``control.should_training_stop``. The monitor is closed at ``on_train_end``.

    With ``trainer`` (``trainer.add_callback(TopologyCallback(monitor, trainer))``) each finished
    measurement is also logged through ``trainer.log`` as ``topology/<feature>`` plus ``topology/step``
    (the step measured; the values arrive at the Trainer's step when the background worker finished,
    usually the next step or so), so ``state.log_history`` and every ``report_to`` integration receive
    them. The Trainer does not hand its callbacks the trainer itself, hence the argument. At the last
    step (or a stop) the callback waits for the measurements still running, so the trackers get them
    before they close.
    """

    def __init__(self, monitor: TopologyMonitor, trainer=None) -> None:
        self.monitor, self.trainer = monitor, trainer
        if trainer is not None:
            monitor.sinks.append(self.to_trainer)

    def to_trainer(self, step: int, values: dict[str, float]) -> None:
        """Log one measurement through the Trainer's own ``log`` (its integrations' ``on_log``).

        ``Trainer.log`` clears ``control.should_log`` (its callback handler's ``on_log`` does). Called from
        ``on_step_end`` at a logging step, after the flow callback set the flag, that would drop the Trainer's
        own ``loss`` row of that step (the last step's, always: the callback waits there), so the flag is put back.
        """
        should_log = self.trainer.control.should_log
        self.trainer.log({f"topology/{name}": value for name, value in values.items()} | {"topology/step": step})
        self.trainer.control.should_log = should_log

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.monitor.step(model, state.global_step):
            control.should_training_stop = True
        if control.should_training_stop or state.global_step >= state.max_steps:
            self.monitor.collect(wait=True)  # before the integrations close at on_train_end
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.monitor.record_losses(state.global_step, train_loss=float(logs["loss"]))

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if metrics and "eval_loss" in metrics:
            self.monitor.record_losses(state.global_step, val_loss=float(metrics["eval_loss"]))

    def on_train_end(self, args, state, control, **kwargs):
        self.monitor.close()
        if self.monitor.stop_reason:
            state.log_history.append({"step": state.global_step, "topology_stop": self.monitor.stop_reason})


@dataclass(frozen=True)
class RunMonitors:
    """The train stage's monitors: called with a run's config (a :class:`topometrics.training.train.RunConfig`)
    and run directory, opens that run's :class:`TopologyMonitor`.

    The observer factory :func:`topometrics.training.run_queue.train_runs` calls in each run's own process, so it
    holds settings only (it is pickled). A run's monitor measures every ``every`` steps with the features
    params ``params`` (as the features stage does for checkpoints), with ``corpus`` (the prepared corpus
    folder; ``train.monitor_surface``) also the loss surface on the run's fixed batch of validation windows,
    logs into ``<run_dir>/monitor/`` with the series name ``<rung>[-<variant>]-live`` and the run's seed,
    and prints a console line per measurement named by its run. No dvclive of its own: its folder would sit
    inside ``data/runs``, an output DVC cannot declare a second time; the stage's relay
    (topometrics.training.live_relay) relays the log.
    """

    every: int
    params: FeaturesParams
    corpus: Path | None = None  # the loss surface's validation tokens (train.monitor_surface); None: off

    def __call__(self, cfg, run_dir: Path) -> TopologyMonitor:
        def log(line: str) -> None:
            print(f"[{cfg.name}] {line}", flush=True)

        folder = Path(run_dir) / MONITOR_DIR
        surface = None if self.corpus is None else SurfaceSource(load_tokens(self.corpus, "val"), cfg.model.context)
        name = live_series_name(cfg)
        return TopologyMonitor(folder, self.every, self.params, name, cfg.recipe.seed, log=log, surface=surface)


def live_series_name(cfg) -> str:
    """The ``rung`` column of a run's monitor log: ``<rung>-live`` (``<rung>-<variant>-live`` for a
    variant), a series name beside the run's own rows in the warehouse."""
    return f"{cfg.rung}-live" if cfg.variant == BASE_VARIANT else f"{cfg.rung}-{cfg.variant}-live"


def _start_worker(pool: ProcessPoolExecutor) -> None:
    with contextlib.suppress(RuntimeError):  # the monitor was closed first: nothing to start
        pool.submit(int)  # a no-op task: submitting starts the worker process
