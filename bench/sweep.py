"""``python -m bench sweep``: a sweep's post-training time against its training time, and the features
stage's overhead per run when every shard is current.

Builds a project from this checkout's pipeline (``tools/same_results.py``'s tiny recipe: rungs ``a`` and
``b`` on the offline corpus) with ``--seeds`` seeds per rung, ``--steps`` steps and a checkpoint every
``--ckpt-every`` steps, then times, each as its own command:

1. ``dvc repro train``: training;
2. ``dvc repro``: everything after it (the features of every run, the series, analysis, warehouse, report);
3. ``dvc repro -f features`` with every shard current: the stage's whole cost when nothing is computed
   (DVC's hashing and lock, the process, the checkpoints' hashing), per run;
4. ``python stages/features.py`` alone, every shard current: the same without DVC, per run.

Prints one line per phase and a JSON line: ``post_over_train`` = (2) / (1), ``current_s_per_run`` = (3) / runs.
The load average is printed with them: the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from tools.same_results import LADDER, TINY, copy_pipeline, project_env

REPO = Path(__file__).resolve().parents[1]


def make_project(project: Path, seeds: int, steps: int, ckpt_every: int) -> int:
    """A git+DVC project of this checkout's pipeline with ``len(LADDER) * seeds`` runs; returns that number."""
    copy_pipeline(REPO, project)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params |= {section: params[section] | values for section, values in TINY.items()}
    params["train"] |= {"seeds": list(range(seeds)), "steps": steps, "ckpt_every": ckpt_every}
    params["ladder"], params["series"]["sources"] = LADDER, {}
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    ident = ["-c", "user.email=bench@topometrics.invalid", "-c", "user.name=bench"]
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", *ident, "commit", "-qm", "bench"]):
        subprocess.run(cmd, cwd=project, check=True, capture_output=True)
    return len(LADDER) * seeds


def timed(cmd: list[str], project: Path, log: Path) -> float:
    """Seconds ``cmd`` took in ``project`` (its output appended to ``log``); exits naming ``log`` if it failed."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=project, env=project_env(project), capture_output=True, text=True)
    seconds = time.perf_counter() - start
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
    if proc.returncode:
        sys.exit(f"error: {' '.join(cmd)} failed in {project}; see {log}")
    return seconds


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench sweep", description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=4, help="seeds per rung (runs = 2 x seeds)")
    ap.add_argument("--steps", type=int, default=200, help="training steps per run")
    ap.add_argument("--ckpt-every", type=int, default=10, help="steps between checkpoints")
    ap.add_argument("--keep", type=Path, help="build the project here and keep it (default: a temporary folder)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        root = args.keep or Path(tmp)
        project, log = root / "project", root / "bench-sweep.log"
        runs = make_project(project, args.seeds, args.steps, args.ckpt_every)
        stage = [sys.executable, "stages/features.py", "--runs", "data/runs", "--corpus", "data/corpus"]
        phases = {
            "train_s": timed(["dvc", "repro", "train"], project, log),
            "post_training_s": timed(["dvc", "repro"], project, log),
            "current_dvc_s": timed(["dvc", "repro", "-f", "features"], project, log),
            "current_stage_s": timed([*stage, "--out", "data/features"], project, log),
        }
        for name, seconds in phases.items():
            print(f"sweep: {name} {seconds:.1f} s ({runs} runs)")
        result = {
            "runs": runs,
            "steps": args.steps,
            "checkpoints_per_run": args.steps // args.ckpt_every + 1,
            **{k: round(v, 2) for k, v in phases.items()},
            "post_over_train": round(phases["post_training_s"] / phases["train_s"], 3),
            "current_s_per_run": round(phases["current_dvc_s"] / runs, 3),
            "current_stage_s_per_run": round(phases["current_stage_s"] / runs, 3),
            "load_average": os.getloadavg(),
        }
        print(json.dumps(result))
    return 0
