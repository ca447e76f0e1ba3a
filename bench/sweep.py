"""``python -m bench sweep``: a sweep's post-training time against its training time, and the features
stage's overhead per run when every shard is current.

Builds a project from this checkout's pipeline in one of two layouts, then times, each as its own command:

* ``--layout tiny`` (the default): ``tools/same_results.py``'s tiny recipe (rungs ``a`` and ``b`` on the
  offline corpus) with ``--seeds`` seeds per rung, ``--steps`` steps and a checkpoint every ``--ckpt-every``;
* ``--layout sweep96``: the 96-run character sweep of docs/results.md as it was run (params.yaml's tiny, small
  and medium rungs × the base recipe, ``lr_hi``, ``lr_lo`` and ``wsd`` × 8 seeds, 1,000 steps, a checkpoint
  every 50, ``features.landscape_every`` 2), with the trace estimated for every rung (``hessian_exact_max`` 0)
  and the many-recipes sweep's primary row, on ``--corpus`` (default: WikiText-2 beside the project,
  ``../shared/data/wikitext-2``, else the offline text); ``--seeds``, ``--steps`` and ``--ckpt-every`` are
  the layout's and are not read. It takes about 45 minutes of two cores;
* ``--layout bpe96``: the same runs on the byte-level BPE 512 tokenizer with the fresh seeds 2, 12, …, 72 and
  losses in bits per byte: the BPE sweep whose row docs/results.md first called a confirmation, as it was run
  (its slice at radius 1) and asked its own question again (``ls_rand_range`` at 20 %, leave-one-seed-out,
  cells permuted within rungs, against the loss curve + norm + curvature), now with the adaptive trace.

The phases:

1. ``dvc repro train``: training;
2. everything after it: ``dvc repro features`` (the features of every run), then ``dvc repro`` (the series,
   analysis, warehouse, report), timed apart (``features_stage_s``, ``after_features_s``; the second DVC start
   costs a second or two), with the checkpoints the features stage wrote from another run's (``shared``);
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
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from tools.same_results import LADDER, TINY, copy_pipeline, project_env
from topometrics.params import parse_params

REPO = Path(__file__).resolve().parents[1]


# The 96-run character sweep's overrides of params.yaml (docs/results.md, "The answer from the 96-run sweep": its
# `dvc exp run -S ...` command), but for the corpus (below) and two changes made since it ran: the curvature's
# trace is the adaptive estimate for every rung, as in the many-recipes sweep (the exact trace of a rung of a few
# thousand parameters costs one product per parameter, 75 s a checkpoint: hours of this layout), and the primary
# row is the many-recipes sweep's question asked of these runs (pre-registered in docs/results.md, "The
# character sweep recomputed").
SWEEP96 = {
    "train": {"steps": 1000, "ckpt_every": 50, "warmup": 100, "seeds": [1, 11, 21, 31, 41, 51, 61, 71]},
    "variants": {"lr_hi": {"lr": 0.006}, "lr_lo": {"lr": 0.0015}, "wsd": {"schedule": "wsd", "decay_fraction": 0.2}},
    "features": {"landscape_every": 2, "hessian_exact_max": 0},
    "analysis": {
        "primary": {
            "family": "landscape",
            "features": ["ls_rand_range"],
            "fraction": 0.2,
            "level": "between",
            "cv": "variant",
            "baseline": "recipe+curvature",
        }
    },
}
# The third primary row's BPE sweep (docs/results.md, "The BPE confirmation sweep": its `dvc exp run -S ...`
# command) over SWEEP96: the tokenizer, the unit, its fresh seeds, its radius-1 slice and its own primary row, the
# question it answered 'adds' (p = 0.01) asked again with today's code (pre-registered in docs/results.md, "The
# BPE confirmation sweep recomputed"); the curvature baseline is now the adaptive trace (standard error <= 5 %),
# not 8 probes.
BPE96 = {
    "data": {"tokenizer": {"kind": "bpe", "vocab_size": 512}},
    "train": SWEEP96["train"] | {"seeds": [2, 12, 22, 32, 42, 52, 62, 72]},
    "features": SWEEP96["features"] | {"landscape_radius": 1.0},
    "analysis": {
        "loss_unit": "bpb",
        "primary": {
            "family": "landscape",
            "features": ["ls_rand_range"],
            "fraction": 0.2,
            "level": "between",
            "cv": "seed",
            "baseline": "norm+curvature",
        },
    },
}
SWEEP96_RUNGS = ("tiny", "small", "medium")
WIKITEXT = REPO.parent / "shared" / "data" / "wikitext-2"


def layout_params(layout: str, seeds: int, steps: int, ckpt_every: int, corpus: Path | None) -> dict:
    """params.yaml of the bench's project in ``layout`` (``tiny``, ``sweep96`` or ``bpe96``, see the module's
    docstring)."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["series"]["sources"] = {}
    if layout == "tiny":
        params |= {section: params[section] | values for section, values in TINY.items()}
        params["train"] |= {"seeds": list(range(seeds)), "steps": steps, "ckpt_every": ckpt_every}
        params["ladder"] = LADDER
        return params
    params |= {section: (params[section] or {}) | values for section, values in SWEEP96.items()}
    if layout == "bpe96":
        params |= {section: params[section] | values for section, values in BPE96.items()}
    params["ladder"] = {rung: params["ladder"][rung] for rung in SWEEP96_RUNGS}
    text = corpus or (WIKITEXT if WIKITEXT.is_dir() else None)
    params["data"] |= {"corpus": str(text.resolve()), "urls": []} if text else {"urls": []}
    return params


def make_project(project: Path, params: dict) -> int:
    """A git+DVC project of this checkout's pipeline with ``params``; returns the number of runs it declares."""
    copy_pipeline(REPO, project)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    ident = ["-c", "user.email=bench@topometrics.invalid", "-c", "user.name=bench"]
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", *ident, "commit", "-qm", "bench"]):
        subprocess.run(cmd, cwd=project, check=True, capture_output=True)
    return len(parse_params(params).runs())


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


def shared_checkpoints(log: str) -> int:
    """The checkpoints the last features stage in ``log`` wrote from another run's (its summary line's count)."""
    found = re.findall(r"^features: \d+ runs, .*?(?:; (\d+) the same as another run's.*)?$", log, re.MULTILINE)
    return int(found[-1] or 0) if found else 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench sweep", description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=4, help="seeds per rung (runs = 2 x seeds)")
    ap.add_argument("--steps", type=int, default=200, help="training steps per run")
    ap.add_argument("--ckpt-every", type=int, default=10, help="steps between checkpoints")
    ap.add_argument(
        "--layout", choices=("tiny", "sweep96", "bpe96"), default="tiny", help="the project's runs (see above)"
    )
    ap.add_argument(
        "--corpus", type=Path, help="sweep96, bpe96: a local text file or folder (default: WikiText-2 beside)"
    )
    ap.add_argument("--keep", type=Path, help="build the project here and keep it (default: a temporary folder)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        root = args.keep or Path(tmp)
        project, log = root / "project", root / "bench-sweep.log"
        params = layout_params(args.layout, args.seeds, args.steps, args.ckpt_every, args.corpus)
        runs = make_project(project, params)
        stage = [sys.executable, "stages/features.py", "--runs", "data/runs", "--corpus", "data/corpus"]
        phases = {"train_s": timed(["dvc", "repro", "train"], project, log)}
        phases["features_stage_s"] = timed(["dvc", "repro", "features"], project, log)
        shared = shared_checkpoints(log.read_text())
        phases["after_features_s"] = timed(["dvc", "repro"], project, log)
        phases["post_training_s"] = phases["features_stage_s"] + phases["after_features_s"]
        phases["current_dvc_s"] = timed(["dvc", "repro", "-f", "features"], project, log)
        phases["current_stage_s"] = timed([*stage, "--out", "data/features"], project, log)
        for name, seconds in phases.items():
            print(f"sweep: {name} {seconds:.1f} s ({runs} runs)")
        result = {
            "layout": args.layout,
            "runs": runs,
            "steps": params["train"]["steps"],
            "checkpoints_per_run": params["train"]["steps"] // params["train"]["ckpt_every"] + 1,
            "corpus": params["data"]["corpus"],
            **{k: round(v, 2) for k, v in phases.items()},
            "post_over_train": round(phases["post_training_s"] / phases["train_s"], 3),
            "shared_checkpoints": shared,
            "current_s_per_run": round(phases["current_dvc_s"] / runs, 3),
            "current_stage_s_per_run": round(phases["current_stage_s"] / runs, 3),
            "load_average": os.getloadavg(),
        }
        print(json.dumps(result))
    return 0
