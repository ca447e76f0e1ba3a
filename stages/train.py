"""Stage `train`: train every declared run (ladder x variants x train.seeds) at once on the whole machine.

    python stages/train.py --configs data/config --corpus data/corpus --runs data/runs \
        --metrics reports/train --curves reports/curves --live reports/live [--run xl-42 ...]

Runs already complete (every checkpoint verified) are skipped untouched; unfinished ones resume
(topometrics.training.run_queue). With `train.monitor_every` > 0 every run trained is watched by a
TopologyMonitor logging into `data/runs/<run>/monitor/` (the measures it computes are not this
stage's deps: tests/test_dvc_deps.py says why). While the runs train, their checkpoint losses and
measurements are relayed into the dvclive folder `--live` (dvc exp show, dvc plots).
`--run NAME` trains only the named runs (their config files must exist: `dvc repro config`).
A run directory that holds another run is refused, untouched.
"""

import sys
from pathlib import Path

from topometrics.errors import TopometricsError, run_stage, stage_parser
from topometrics.params import FeaturesParams, ParamsError, load_params
from topometrics.training.run_queue import ObserverFactory, RunFiles, plan_pool, train_runs
from topometrics.training.train import load_run_config


def main(argv: list[str]) -> None:
    ap = stage_parser(__doc__)
    ap.add_argument("--configs", type=Path, required=True, help="data/config (one <run>.json per run)")
    ap.add_argument("--corpus", type=Path, required=True, help="prepared corpus directory")
    ap.add_argument("--runs", type=Path, required=True, help="parent of the run directories")
    ap.add_argument("--metrics", type=Path, required=True, help="directory of per-run metrics JSON")
    ap.add_argument("--curves", type=Path, required=True, help="directory of per-run loss curves for dvc plots")
    ap.add_argument("--live", type=Path, help="dvclive folder the runs' losses and measurements are relayed into")
    ap.add_argument("--run", action="append", default=[], help="train only this run (repeatable), e.g. xl-42")
    args = ap.parse_args(argv)
    params = load_params(args.params)
    names = params.run_names()
    if unknown := [n for n in args.run if n not in names]:
        raise ParamsError(f"--run {unknown[0]} is not declared in params.yaml; runs are {', '.join(names)}")
    runs = [
        RunFiles(load_run_config(args.configs / f"{n}.json"), args.runs / n, args.metrics / f"{n}.json",
                 args.curves / f"{n}.csv")
        for n in args.run or names
    ]  # fmt: skip
    t = params.train
    pool = plan_pool(t.device, t.workers, t.threads, len(runs))
    watch = observers(t.monitor_every, params.features)
    summaries = train_runs(runs, args.corpus, pool, observers=watch, live=args.live)
    bad = {n: s["status"] for n, s in summaries.items() if s["status"] != "complete"}
    print(f"train: {len(summaries) - len(bad)}/{len(summaries)} runs complete" + "".join(
        f"; {n}: {status}" for n, status in bad.items()))  # fmt: skip
    if mistakes := [f"{n}: {s['mistake']}" for n, s in summaries.items() if s.get("mistake")]:
        raise TopometricsError("; ".join(mistakes))
    if any(status.startswith("failed") for status in bad.values()):
        sys.exit(1)


def observers(monitor_every: int, features: FeaturesParams) -> list[ObserverFactory]:
    """The observer factories of every run: a live monitor's when ``train.monitor_every`` > 0."""
    if monitor_every <= 0:
        return []
    from topometrics.features.monitor import (
        RunMonitors,  # only when monitoring: it imports the measures and transformers
    )

    return [RunMonitors(monitor_every, features)]


if __name__ == "__main__":
    run_stage(main)
