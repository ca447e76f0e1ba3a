"""Topology while training runs: weight features every ``every`` steps, computed in the background.

:class:`TopologyMonitor` serves any PyTorch loop (``monitor.step(model, step, loss=...)``) and
:class:`TopologyCallback` the Hugging Face ``Trainer``. At a measured step the linear weights
(:mod:`topometrics.architectures`) are copied to CPU float32 arrays; that copy is all the training
loop waits for. A worker process computes the weight features of the copy
(:func:`topometrics.features.weight_features`: NP, shuffled NP, Vietoris-Rips of rows, spectral
baselines; no forward pass, no distances) and writes them as one Parquet file per measurement in
the features schema. Files are written to a temporary name and renamed, so a killed run leaves
only complete files (and temporaries that readers never match).

Log folder::

    features-<step>.parquet   (rung, seed, step, layer, feature, value, reason) of one measurement
    losses-<step>.parquet     (step, val_loss, train_loss) logged at measured steps (several files may
                              hold one step: the train loss at the step, the eval loss when it arrives)
    stop.json                 why early stopping asked the run to stop (only when it did)
    dvclive/                  the same values through dvclive, when running inside ``dvc repro``/``dvc exp run``

Optional early stopping follows Rieck et al. (2019), Algorithm 2, on NP (layer ``all``'s
``np_norm``, the mean over layers): the best value starts at 0; a measurement above best +
``min_delta`` is an improvement, anything else adds one to a counter; the run is asked to stop when
the counter reaches ``patience`` measurements. As results arrive in the background, the decision
comes one measurement or so after the step it is about.

The worker is started with the ``forkserver`` method (``spawn`` where there is none), so a script
that uses the monitor must guard its entry point with ``if __name__ == "__main__":`` as for any
``multiprocessing`` code.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import sys
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from threadpoolctl import threadpool_limits
from torch import nn
from transformers import TrainerCallback

from topometrics.architectures import LinearLayer, module_layers, oriented
from topometrics.atomic import write_parquet, write_text
from topometrics.features import FEATURE_COLUMNS, CheckpointFeatures, features_frame, weight_features
from topometrics.params import FeaturesParams
from topometrics.vocabulary import ALL, HEAVY_TAIL, MODEL, NP, SCALE_FREE, SPECTRAL, VR, lookup, model_level, per_layer

SHOWN = ("np_norm", "vr_tp0", "vr_tp1", "w_rankme", "w_fro")  # layer-'all' features on the console line
LOSS_COLUMNS = ["step", "val_loss", "train_loss"]
WEIGHT_FAMILIES = (NP, VR, SPECTRAL, SCALE_FREE, HEAVY_TAIL)  # what weight_features computes (per layer)


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
    params : FeaturesParams
        ``max_points`` and ``seed`` of the weight features (as for checkpoints).
    rung, seed : str, int
        The ``rung`` and ``seed`` columns of the rows (the series name the warehouse shows).
    patience : int, optional
        Enables NP early stopping: measurements without improvement before asking to stop.
    min_delta : float
        An improvement must beat the best NP by more than this.
    max_pending_bytes : int
        Bytes of weight snapshots allowed in flight (each waits in this process until the worker
        is done with it); a measured step whose snapshot would exceed it is skipped (and said so),
        so a slow measurement never makes training wait. One snapshot is always allowed. The
        default, 1 GiB, holds thousands of snapshots of a small model and one of a 1B model.
    live : bool, optional
        Also log through dvclive; default: when running under ``dvc repro``/``dvc exp run``.
    log : callable
        Receives one line per measurement.
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
        live: bool | None = None,
        log=print,
    ) -> None:
        if every <= 0:
            raise ValueError(f"every must be a positive number of steps, got {every}")
        if patience is not None and patience <= 0:
            raise ValueError(f"patience must be a positive number of measurements, got {patience}")
        self.out_dir, self.every, self.params = Path(out_dir), every, params or FeaturesParams()
        self.rung, self.seed, self.patience, self.min_delta = rung, seed, patience, min_delta
        self.max_pending_bytes, self.log = max_pending_bytes, log
        self.layers: list[LinearLayer] | None = None
        self.pending: dict[int, tuple[Future, float]] = {}
        self.best, self.wait, self.best_step = 0.0, 0, None
        self.stop_reason: str | None = None
        self.measured: list[int] = []
        self.skipped: list[int] = []
        self._pool = ProcessPoolExecutor(1, mp_context=_context(), initializer=_worker_init)
        # Start the worker now, beside the caller's own setup: the first start (the fork server
        # importing torch and the features) takes seconds the first measured step would otherwise wait.
        threading.Thread(target=_start_worker, args=(self._pool,), daemon=True).start()
        self._live = _open_live(self.out_dir / "dvclive") if (_under_dvc() if live is None else live) else None

    # -- the training loop's side -------------------------------------------------------------

    def step(self, model: nn.Module, step: int, loss: float | None = None) -> bool:
        """Measure at multiples of ``every`` (copy the weights, queue the features); collect
        finished measurements. Returns True once early stopping asks the run to stop."""
        self.collect()
        if step % self.every:
            return self.should_stop
        if self.pending and (len(self.pending) + 1) * self.snapshot_bytes(model) > self.max_pending_bytes:
            self.skipped.append(step)
            self.log(f"monitor: step {step} not measured, {len(self.pending)} measurements still running")
            return self.should_stop
        start = time.perf_counter()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        snapshot = self.snapshot(model)
        future = self._pool.submit(_measure, self.out_dir, snapshot, self.params, self.rung, self.seed, step)
        self.pending[step] = (future, time.perf_counter() - start)
        if loss is not None:
            self.record_losses(step, train_loss=loss)
        return self.should_stop

    def linear_layers(self, model: nn.Module) -> list[LinearLayer]:
        """The model's linear layers (:func:`topometrics.architectures.module_layers`), found once."""
        if self.layers is None:
            self.layers = module_layers(model)
        return self.layers

    def snapshot_bytes(self, model: nn.Module) -> int:
        """Bytes of one :meth:`snapshot` (float32 copies of the linear weights)."""
        return sum(4 * model.get_parameter(layer.tensor).numel() for layer in self.linear_layers(model))

    def snapshot(self, model: nn.Module) -> dict[str, tuple[np.ndarray, bool]]:
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
        """Append the losses logged at a measured step (ignored at other steps)."""
        if step % self.every:
            return
        frame = pd.DataFrame([(step, val_loss, train_loss)], columns=LOSS_COLUMNS).astype(
            {"val_loss": "float64", "train_loss": "float64"}
        )
        kind = "eval" if val_loss is not None else "train"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        write_parquet(self.out_dir / f"losses-{step:09d}-{kind}.parquet", frame)
        if self._live is not None:
            self._live.step = step
            for name, value in (("val_loss", val_loss), ("train_loss", train_loss)):
                if value is not None:
                    self._live.log_metric(f"monitor/{name}", value, plot=True)

    @property
    def should_stop(self) -> bool:
        return self.stop_reason is not None

    # -- results -------------------------------------------------------------------------------

    def collect(self, wait: bool = False) -> None:
        """Take finished measurements in step order: console line, early stopping, dvclive."""
        for step in sorted(self.pending):
            future, copy_s = self.pending[step]
            if not (wait or future.done()):
                break  # keep step order: later results wait for earlier ones
            del self.pending[step]
            summary = future.result()
            self.measured.append(step)
            shown = " ".join(f"{k} {summary[k]:.4g}" for k in SHOWN if k in summary)
            self.log(
                f"monitor: step {step} {shown} (copy {copy_s * 1000:.0f} ms, features {summary['_seconds']:.1f} s)"
            )
            self._live_step(step, summary)
            self._early_stopping(step, summary.get("np_norm", np.nan))

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
        if np.isfinite(np_value) and np_value > self.best + self.min_delta:
            self.best, self.wait, self.best_step = np_value, 0, step
            return
        self.wait += 1
        if self.wait >= self.patience:
            best = f"{self.best:.4f} (step {self.best_step})" if self.best_step is not None else "0"
            self.stop_reason = (
                f"NP early stopping at step {step}: NP has not risen above {best} by more than "
                f"{self.min_delta} for {self.patience} measurements (Rieck et al. 2019, Algorithm 2)"
            )
            record = {"step": step, "reason": self.stop_reason, "best_np": self.best, "best_step": self.best_step}
            write_text(self.out_dir / "stop.json", json.dumps(record, indent=1))
            self.log(f"monitor: {self.stop_reason}")

    def _live_step(self, step: int, summary: dict) -> None:
        if self._live is None:
            return
        self._live.step = step
        for name in SHOWN:
            if name in summary and np.isfinite(summary[name]):
                self._live.log_metric(f"monitor/{name}", float(summary[name]))
        self._live.make_summary()


class TopologyCallback(TrainerCallback):
    """A ``transformers.Trainer`` callback around :class:`TopologyMonitor`.

    Measures at ``on_step_end`` when ``global_step % every == 0``; the train loss (``on_log``) and
    eval loss (``on_evaluate``) logged at measured steps go to the losses log; early stopping
    sets ``control.should_training_stop``. The monitor is closed at ``on_train_end``.
    """

    def __init__(self, monitor: TopologyMonitor) -> None:
        self.monitor = monitor

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.monitor.step(model, state.global_step):
            control.should_training_stop = True
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


# ---------------------------------------------------------------------------
# The log folder
# ---------------------------------------------------------------------------


def read_log(out_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The complete parts of a log folder: features rows and one losses row per step.

    Only ``features-*.parquet`` / ``losses-*.parquet`` are read (never the temporaries of an
    interrupted write). Losses of one step from several files are merged (first value of each).
    """
    out_dir = Path(out_dir)
    parts = [pd.read_parquet(p) for p in sorted(out_dir.glob("features-*.parquet"))]
    features = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=FEATURE_COLUMNS)
    loss_parts = [pd.read_parquet(p) for p in sorted(out_dir.glob("losses-*.parquet"))]
    losses = pd.concat(loss_parts, ignore_index=True) if loss_parts else pd.DataFrame(columns=LOSS_COLUMNS)
    losses = losses.astype({"step": "int64", "val_loss": "float64", "train_loss": "float64"})
    return features, losses.groupby("step", as_index=False).first()


def latest_measurement(out_dir: Path) -> dict | None:
    """The last complete measurement of a log folder: ``step``, the number of ``measurements``
    and the layer-'all' values shown on the console (:data:`SHOWN`); None when there is none."""
    parts = sorted(Path(out_dir).glob("features-*.parquet"))
    if not parts:
        return None
    rows = pd.read_parquet(parts[-1])  # names hold the step zero-padded: the last name is the last step
    shown = rows[(rows["layer"] == ALL) & rows["feature"].isin(SHOWN)]
    values = {f: (float(v) if np.isfinite(v) else None) for f, v in zip(shown["feature"], shown["value"], strict=True)}
    return {"step": int(rows["step"].iloc[0]), "measurements": len(parts)} | values


# ---------------------------------------------------------------------------
# The worker
# ---------------------------------------------------------------------------


def _measure(out_dir: Path, snapshot: dict, params: FeaturesParams, rung: str, seed: int, step: int) -> dict:
    """Weight features of one snapshot, written as ``features-<step>.parquet``; returns layer 'all'."""
    start = time.perf_counter()
    weights = {name: oriented(w, transposed) for name, (w, transposed) in snapshot.items()}
    if all(np.isfinite(w).all() for w in weights.values()):
        result = weight_features(weights, params)
    else:  # every weight feature NULL with the reason, as for a diverged checkpoint
        result, reason = CheckpointFeatures(), "diverged: non-finite weights in a linear layer"
        for name in weights:
            result.add(name, dict.fromkeys([n for f in WEIGHT_FAMILIES for n in per_layer(f)], np.nan), reason)
        aggregates = [n for f in WEIGHT_FAMILIES for n in model_level(f) if lookup(n).aggregate != MODEL]
        result.add(ALL, dict.fromkeys(aggregates, np.nan), reason)
    write_parquet(Path(out_dir) / f"features-{step:09d}.parquet", features_frame(result, rung, seed, step))
    summary = {feature: value for layer, feature, value, _ in result.rows if layer == ALL}
    return summary | {"_seconds": time.perf_counter() - start}


def _start_worker(pool: ProcessPoolExecutor) -> None:
    with contextlib.suppress(RuntimeError):  # the monitor was closed first: nothing to start
        pool.submit(int)  # a no-op task: submitting starts the worker process


def _worker_init() -> None:
    # One thread: the worker shares the machine with the training loop it must not slow down. (Not a
    # lower priority: on a machine training fills, the worker would then fall behind and skip steps.)
    torch.set_num_threads(1)
    threadpool_limits(1)


def _context() -> multiprocessing.context.BaseContext:
    # Not fork: forking a process whose torch threads are running can deadlock.
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    # The server imports torch and the features once per process (read only when it starts); each
    # monitor's worker is then forked from it ready, instead of paying seconds of imports.
    context.set_forkserver_preload(["topometrics.monitor"])
    return context


def _under_dvc() -> bool:
    """Inside ``dvc repro`` or ``dvc exp run`` (DVC sets these for the stage's command)."""
    return bool(os.environ.get("DVC_ROOT") or os.environ.get("DVC_EXP_BASELINE_REV"))


def _open_live(path: Path):
    """dvclive's logger that never writes or rewrites dvc.yaml and never saves an experiment itself
    (``dvc exp run`` does that); resumed when the folder exists (a resumed training run)."""
    from dvclive import Live  # imported only when used: it imports dvc

    sys.stdout.flush()
    return Live(dir=str(path), resume=path.exists(), dvcyaml=None, save_dvc_exp=False, report=None)
