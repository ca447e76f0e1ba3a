"""Stage `train`: train every declared run (ladder x variants x train.seeds) at once on the whole machine.

    python stages/train.py --configs data/config --corpus data/corpus --runs data/runs \
        --metrics reports/train --curves reports/curves --live reports/live [--run xl-42 ...]

Runs already complete (every checkpoint verified) are skipped untouched; unfinished ones resume
(topometrics.training.run_queue). With `train.monitor_every` > 0 every run trained is watched by a
TopologyMonitor logging into `data/runs/<run>/monitor/` (the measures it computes are not this
stage's deps: tests/pipeline/test_dvc_deps.py says why). With `train.sketch_every` > 0 (the default) every run
trained records a sketch of its weights every few steps into `data/runs/<run>/trajectory_sketch.csv`
(topometrics.training.sketch). While the runs train, their checkpoint losses and
measurements are relayed into the dvclive folder `--live` (dvc exp show, dvc plots).
`--run NAME` trains only the named runs (their config files must exist: `dvc repro config`).
A run directory that holds another run is refused, untouched.
"""

from pathlib import Path

import checkout  # noqa: F401 (first: this checkout's topometrics, not the environment's)

from topometrics.errors import run_stage, stage_parser
from topometrics.params import FeaturesParams, TrainParams, load_params
from topometrics.training.run_queue import ObserverFactory, TrainPaths, train_declared
from topometrics.training.sketch import TrajectorySketches


def main(argv: list[str]) -> None:
    ap = stage_parser(__doc__)
    ap.add_argument("--configs", type=Path, required=True, help="data/config (one <run>.json per run)")
    ap.add_argument("--corpus", type=Path, required=True, help="prepared corpus directory")
    ap.add_argument("--runs", type=Path, required=True, help="parent of the run directories")
    ap.add_argument("--metrics", type=Path, required=True, help="reports/train: one <run>.json per run (an output)")
    ap.add_argument("--curves", type=Path, required=True, help="directory of per-run loss curves for dvc plots")
    ap.add_argument("--live", type=Path, help="dvclive folder the runs' losses and measurements are relayed into")
    ap.add_argument("--run", action="append", default=[], help="train only this run (repeatable), e.g. xl-42")
    args = ap.parse_args(argv)
    params = load_params(args.params)
    paths = TrainPaths(args.configs, args.corpus, args.runs, args.metrics, args.curves, args.live)
    train_declared(params, paths, args.run, observers(params.train, params.features, args.corpus))


def observers(train: TrainParams, features: FeaturesParams, corpus: Path | None = None) -> list[ObserverFactory]:
    """The observer factories of every run: the trajectory sketch's when ``train.sketch_every`` > 0, a live
    monitor's when ``train.monitor_every`` > 0 (with the loss surface on ``corpus``'s validation windows
    when ``train.monitor_surface``)."""
    found: list[ObserverFactory] = []
    if train.sketch_every > 0:
        found.append(TrajectorySketches(train.sketch_dim, train.sketch_every))
    if train.monitor_every > 0:
        from topometrics.features.monitor import RunMonitors  # only when monitoring: it imports the measures

        found.append(RunMonitors(train.monitor_every, features, corpus if train.monitor_surface else None))
    return found


if __name__ == "__main__":
    run_stage(main)
