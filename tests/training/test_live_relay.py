"""topometrics.training.live_relay: dvclive's folder follows the queue's runs while they train."""

import json
import threading
import time
from pathlib import Path

from tests.repo_params import features_params
from tests.run_helpers import config, corpus, files
from tests.training.helpers import quiet
from topometrics.features.monitor import RunMonitors
from topometrics.models.checkpoints import list_checkpoints
from topometrics.training.live_relay import LiveRelay
from topometrics.training.monitor_log import read_log
from topometrics.training.run_queue import (
    Pool,
    train_runs,
)
from topometrics.training.train import recipe_fingerprint


def tsv(path: Path) -> list[tuple[int, float]]:
    """The (step, value) rows of a dvclive metric history (empty while it does not exist)."""
    lines = path.read_text().splitlines()[1:] if path.exists() else []
    return [(int(step), float(value)) for step, value in (line.split("\t") for line in lines)]


def test_a_live_folder_shows_every_run_while_the_queue_trains_and_holds_every_value_once_at_the_end(tmp_path):
    data = corpus(tmp_path / "corpus")
    runs = [files(tmp_path, config(seed=1, steps=200)), files(tmp_path, config(seed=2, steps=20, lr=float("inf")))]
    live = tmp_path / "live"
    watch = features_params(max_points=20, workers=1)
    args = (runs, data, Pool(2, 1, ("cpu",)), 30.0, quiet, [RunMonitors(50, watch)], live, 0.05)  # relayed every 50 ms
    queue = threading.Thread(target=train_runs, args=args)
    queue.start()
    seen_while_training = []
    while queue.is_alive():
        rows = tsv(live / "plots/metrics/t-1/val_loss.tsv")
        if rows and not runs[0].metrics.exists():  # the run's metrics JSON is written when the queue ends
            seen_while_training.append(rows[-1][0])
        time.sleep(0.02)
    queue.join()
    assert seen_while_training and min(seen_while_training) < 200  # shown before the run had finished

    curve = [(c.step, c.meta["val_loss"]) for c in list_checkpoints(runs[0].run_dir)]
    assert tsv(live / "plots/metrics/t-1/val_loss.tsv") == curve  # every checkpoint once, in order
    features, _ = read_log(runs[0].run_dir / "monitor")
    np_norm = features[(features["layer"] == "all") & (features["feature"] == "np_norm")].sort_values("step")
    measured = list(zip(np_norm["step"], np_norm["value"], strict=True))
    assert tsv(live / "plots/metrics/t-1/np_norm.tsv") == measured and measured[0][0] == 0  # (a step may be skipped)
    summary = json.loads((live / "metrics.json").read_text())
    assert summary["t-1"]["val_loss"] == curve[-1][1] and summary["t-1"]["np_norm"] == np_norm["value"].iloc[-1]
    assert [s for s, _ in tsv(live / "plots/metrics/t-2/val_loss.tsv")] == [0]  # diverged at once: one checkpoint

    # a later queue (nothing to train) relays the finished runs again from the start, each value once
    train_runs(runs[:1], data, Pool(1, 1, ("cpu",)), log=quiet, live=live)
    assert tsv(live / "plots/metrics/t-1/val_loss.tsv") == curve
    assert not (live / "plots/metrics/t-2").exists()
    stale = files(tmp_path, config(seed=1, steps=200, lr=1e-3))  # another recipe in the same run directory
    relay = LiveRelay(tmp_path / "live-stale", {"t-1": (stale.run_dir, recipe_fingerprint(stale.config, "test"))})
    assert relay.poll() == 0  # no checkpoint of this recipe: neither its sidecars nor its monitor log are relayed
