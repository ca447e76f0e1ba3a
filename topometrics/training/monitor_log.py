"""A live monitor's log folder: the one module that spells its file names, and what writes and reads them.

Folder (``<run_dir>/monitor`` for a run of the train stage)::

    features-<step>.parquet        one measurement's rows in the features schema (rung, seed, step, layer,
                                   feature, value, reason); its Parquet metadata records what measured it
                                   (:func:`measured_with`: code version and features params digest)
    losses-<step>-<kind>.parquet   (step, val_loss, train_loss) logged at a measured step; ``kind`` is
                                   ``train`` (the batch loss) or ``eval`` (the validation loss, when it
                                   arrives), so several files may hold one step
    stop.json                      why early stopping asked the run to stop (only when it did)
    dvclive/                       the same values through dvclive (only when the monitor is opened with ``live``)

Every file is written to a temporary name and renamed, so a killed run leaves only complete files
(and temporaries, ``*.tmp``, that no reader matches). The monitor (topometrics.features.monitor) writes the
folder; a run directory (topometrics.training.run_dir) discards these files with a stale run's others; the
train stage's relay (topometrics.training.live_relay) and reports (topometrics.training.run_queue) read the latest
measurements; a series (topometrics.series.checkpoint) reads the whole log.

Nothing here computes or imports a measure: training imports this module (through run_dir), and a
change to a measure must not retrain. The two facts of the features schema a reader needs are
spelled here too (:data:`ROW_COLUMNS`, :data:`MODEL_LAYER`); ``tests/training/test_monitor_log.py`` checks that
they equal ``topometrics.features.checkpoint.FEATURE_COLUMNS`` and ``topometrics.vocabulary.ALL``.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from topometrics.atomic import replacing, write_parquet, write_text

MONITOR_DIR = "monitor"  # a run's log folder inside its run directory
STOP_FILE = "stop.json"
DVCLIVE_DIR = "dvclive"
FEATURE_PARTS = "features-*.parquet"
LOSS_PARTS = "losses-*.parquet"
LOG_FILES = ("features-*", "losses-*", STOP_FILE, "*.tmp")  # what a monitor writes (dvclive/ is dvclive's)
RUN_DIR_FILES = tuple(f"{MONITOR_DIR}/{name}" for name in LOG_FILES)  # the same, relative to a run directory

SHOWN = ("np_norm", "vr_tp0", "vr_tp1", "w_rankme", "w_fro")  # layer-'all' features on the console line
ROW_COLUMNS = ["rung", "seed", "step", "layer", "feature", "value", "reason"]  # the features schema
MODEL_LAYER = "all"  # the features schema's layer of model-level rows
LOSS_COLUMNS = ["step", "val_loss", "train_loss"]
MEASURED_WITH_KEY = b"topometrics.monitor"  # Parquet metadata of a features part: what measured it


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------


def write_measurement(folder: Path, step: int, rows: pd.DataFrame, measured_with: dict) -> Path:
    """One measurement's rows as ``features-<step>.parquet`` (a re-measured step replaces its file).

    ``measured_with`` (JSON-able, e.g. ``{"code": ..., "params": ...}``) goes into the file's Parquet
    metadata, so a log measured by other code or params than the checkpoints' features is detectable.
    """
    path = Path(folder) / f"features-{step:09d}.parquet"
    table = pa.Table.from_pandas(rows, preserve_index=False)
    metadata = (table.schema.metadata or {}) | {MEASURED_WITH_KEY: json.dumps(measured_with, sort_keys=True).encode()}
    with replacing(path) as tmp:
        pq.write_table(table.replace_schema_metadata(metadata), tmp)
    return path


def write_losses(folder: Path, step: int, val_loss: float | None = None, train_loss: float | None = None) -> None:
    """The losses (nats) logged at a measured step: ``losses-<step>-eval.parquet`` when ``val_loss`` is
    given, else ``losses-<step>-train.parquet``; one row of :data:`LOSS_COLUMNS`, a missing loss NaN."""
    frame = pd.DataFrame([(step, val_loss, train_loss)], columns=LOSS_COLUMNS).astype(
        {"val_loss": "float64", "train_loss": "float64"}
    )
    kind = "eval" if val_loss is not None else "train"
    Path(folder).mkdir(parents=True, exist_ok=True)
    write_parquet(Path(folder) / f"losses-{step:09d}-{kind}.parquet", frame)


def write_stop(folder: Path, record: dict) -> None:
    """``stop.json``: the step early stopping asked the run to stop at, and why."""
    write_text(Path(folder) / STOP_FILE, json.dumps(record, indent=1))


def read_stop(folder: Path) -> dict:
    """What ``stop.json`` records ({} when early stopping never asked to stop)."""
    path = Path(folder) / STOP_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


def measurement_parts(folder: Path) -> list[Path]:
    """The complete measurement files of a log folder in step order (names hold the step zero-padded);
    regular files only (a FIFO under such a name would block its reader forever)."""
    return sorted(p for p in Path(folder).glob(FEATURE_PARTS) if p.is_file())


def read_log(folder: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The complete parts of a log folder: features rows (:data:`ROW_COLUMNS`) and one losses row per step.

    Only ``features-*.parquet`` / ``losses-*.parquet`` are read (never the temporaries of an
    interrupted write). Losses of one step from several files are merged (first value of each).
    """
    parts = [pd.read_parquet(p) for p in measurement_parts(folder)]
    features = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=ROW_COLUMNS)
    loss_parts = [pd.read_parquet(p) for p in sorted(Path(folder).glob(LOSS_PARTS)) if p.is_file()]
    losses = pd.concat(loss_parts, ignore_index=True) if loss_parts else pd.DataFrame(columns=LOSS_COLUMNS)
    losses = losses.astype({"step": "int64", "val_loss": "float64", "train_loss": "float64"})
    return features, losses.groupby("step", as_index=False).first()


def shown_values(part: Path) -> tuple[int, dict[str, float]]:
    """The step of one measurement file and its layer-'all' values of :data:`SHOWN` (NaN where NULL)."""
    rows = pd.read_parquet(part)
    shown = rows[(rows["layer"] == MODEL_LAYER) & rows["feature"].isin(SHOWN)]
    return int(rows["step"].iloc[0]), {f: float(v) for f, v in zip(shown["feature"], shown["value"], strict=True)}


def latest_measurement(folder: Path) -> dict | None:
    """The last complete measurement of a log folder: ``step``, the number of ``measurements`` and the
    layer-'all' values of :data:`SHOWN` (None where NULL); None when there is none."""
    parts = measurement_parts(folder)
    if not parts:
        return None
    step, values = shown_values(parts[-1])
    finite = {f: (v if math.isfinite(v) else None) for f, v in values.items()}
    return {"step": step, "measurements": len(parts)} | finite


def measured_with(part: Path) -> dict | None:
    """What measured one features part (:func:`write_measurement`'s ``measured_with``); None when the
    file does not say (a log written before measurements recorded it)."""
    raw = (pq.read_schema(part).metadata or {}).get(MEASURED_WITH_KEY)
    return json.loads(raw) if raw else None


# ---------------------------------------------------------------------------
# dvclive
# ---------------------------------------------------------------------------


class LiveLog:
    """The log's values through dvclive into ``<folder>/dvclive`` as ``monitor/<name>``, for ``dvc exp show``
    and ``dvc plots show`` in a user's own ``dvc.yaml`` (docs/series.md).

    dvclive never writes or rewrites ``dvc.yaml`` and never saves an experiment itself (``dvc exp run``
    does that); the folder is resumed when it exists (a resumed training run).
    """

    def __init__(self, folder: Path) -> None:
        from dvclive import Live  # imported only when used: it imports dvc

        path = Path(folder) / DVCLIVE_DIR
        sys.stdout.flush()
        self.live = Live(dir=str(path), resume=path.exists(), dvcyaml=None, save_dvc_exp=False, report=None)

    def log(self, step: int, values: dict[str, float | None], summary: bool = False) -> None:
        """Log the finite values at ``step``; ``summary`` also rewrites ``metrics.json`` (the latest values)."""
        self.live.step = step
        for name, value in values.items():
            if value is not None and math.isfinite(value):
                self.live.log_metric(f"monitor/{name}", float(value), plot=True)
        if summary:
            self.live.make_summary()

    def end(self) -> None:
        self.live.end()
