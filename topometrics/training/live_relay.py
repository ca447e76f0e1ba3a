"""What the train stage's runs show while they train, relayed into one dvclive folder.

Each run of the train stage writes its own files in its own process: a checkpoint sidecar per
checkpoint (:mod:`topometrics.models.checkpoints`) and, with ``train.monitor_every`` > 0, its live
monitor's log (:mod:`topometrics.training.monitor_log`). The stage's parent process relays what is new
every few seconds into one dvclive folder (``reports/live``), whose ``plots/metrics`` ``dvc.yaml``
declares as the train stage's plots (and ``metrics.json`` as an output, not a metric: a metric per run
would widen ``dvc exp show`` with every run). ``dvc plots show`` reads the workspace, so it (and the
DVC editor integrations built on it) shows the runs while the stage runs, not only when it ends.

Names, per run (``<run>`` = ``<rung>[-<variant>]-<seed>``)::

    <run>/val_loss, <run>/train_loss   at every checkpoint step (its sidecar)
    <run>/<feature>                    at every monitor measurement: layer 'all' of SHOWN

``metrics.json`` holds the latest value of each (nested by run) plus dvclive's ``step``, the step
last relayed, of whichever run that was. Non-finite values (a diverged run) are not relayed.

Why one relay rather than dvclive in every run: a folder per run would need an output per run in
``dvc.yaml`` (the runs come from params), and a dvclive folder mixes JSON and TSV files, which a
DVC metrics directory cannot hold. The relay only reads complete files (sidecars and log parts
are written atomically) and never touches a run's folder. A run directory of another recipe (a
stale run about to be retrained) is not relayed: its sidecars do not match the run's recipe
fingerprint, and its monitor log is relayed only once a sidecar does (training discards the old log
before it writes its first checkpoint).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from topometrics.training.monitor_log import MONITOR_DIR, measurement_parts, shown_values

LOSSES = ("val_loss", "train_loss")  # relayed from every checkpoint sidecar


class LiveRelay:
    """Relays new checkpoint losses and monitor measurements of many runs into one dvclive folder.

    Parameters
    ----------
    live_dir : Path
        The dvclive folder; whatever an earlier relay left there is replaced (dvclive's cleanup),
        and every run's files are relayed again from the start.
    runs : dict
        ``{run name: (run directory, recipe fingerprint)}``; only sidecars with that fingerprint count.
    """

    def __init__(self, live_dir: Path, runs: dict[str, tuple[Path, str]]) -> None:
        from dvclive import Live  # imported only when relaying: it imports dvc

        sys.stdout.flush()
        # dvcyaml=None: dvclive never writes dvc.yaml; save_dvc_exp=False: `dvc exp run` saves the experiment.
        self.live = Live(dir=str(live_dir), resume=False, dvcyaml=None, save_dvc_exp=False, report=None)
        self.runs = {name: (Path(run_dir), fingerprint) for name, (run_dir, fingerprint) in runs.items()}
        self.seen: set[Path] = set()  # files relayed
        self.current: set[str] = set()  # runs with a checkpoint of their recipe

    def poll(self) -> int:
        """Relay every complete file not relayed yet; returns the number of values relayed."""
        relayed = 0
        for name, (run_dir, fingerprint) in self.runs.items():
            for step, values in self._new_checkpoints(run_dir, fingerprint):
                relayed += self._log(name, step, values)
                self.current.add(name)
            if name in self.current:  # the log is this recipe's: training discards another recipe's first
                for step, values in self._new_measurements(run_dir / MONITOR_DIR):
                    relayed += self._log(name, step, values)
        if relayed:
            self.live.make_summary()
        return relayed

    def close(self) -> None:
        """Relay what is left and close the dvclive folder (its summary written)."""
        self.poll()
        self.live.end()

    def _new_checkpoints(self, run_dir: Path, fingerprint: str):
        for sidecar in sorted(run_dir.glob("step_*.json")):
            if sidecar in self.seen:
                continue
            try:
                meta = json.loads(sidecar.read_text())
            except (OSError, json.JSONDecodeError, UnicodeDecodeError):
                continue  # training itself names a damaged sidecar and recomputes it; read again next poll
            if isinstance(meta, dict) and meta.get("recipe_fingerprint") == fingerprint:
                self.seen.add(sidecar)  # another recipe's is read again: training replaces it
                yield int(meta["step"]), {k: meta.get(k) for k in LOSSES}

    def _new_measurements(self, folder: Path):
        for part in measurement_parts(folder):
            if part not in self.seen:
                self.seen.add(part)
                yield shown_values(part)

    def _log(self, run: str, step: int, values: dict) -> int:
        finite = {k: float(v) for k, v in values.items() if isinstance(v, int | float) and math.isfinite(v)}
        self.live.step = step
        for key, value in finite.items():
            self.live.log_metric(f"{run}/{key}", value)
        return len(finite)
