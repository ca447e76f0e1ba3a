"""The GPU check, ready to run: every CUDA path of the project in one call, one JSON file.

    python -m bench device [--out device.json] [--tiny] [--device auto|cpu|cuda] [--params params.yaml]

Sections, in order; each is timed, and a section that fails records its one-line error in the JSON and the
next still runs (a GPU session is short: one broken path must not hide the others):

  train     the ladder's rungs at params.yaml's recipe, every step, through the run queue
            (topometrics.training.run_queue.train_runs and its pool: 4 runs per GPU) on the offline corpus
            (CPython's pydoc topics: nothing downloaded): runs per device, each run's status, tokens/s and
            final validation loss, the queue's wall time; beside it the CPU projection of the same runs, measured
            here: each rung's serial step on one CPU thread (bench.train), its whole run, and the longest-first
            schedule of those runs over this machine's usable cores; then the first run trained again, every
            checkpoint compared bit for bit with the first training's (``retrained_bit_identical``: resuming a
            run and moving it between workers rely on it; on CUDA, models.model.deterministic_on)
  features  every checkpoint of those runs through the features stage's path
            (topometrics.features.sweep.sweep_shards) with ``features.device``; then the last checkpoint of
            each run on the CPU and on the device: per feature, the largest relative difference
            (``cpu_vs_device``; the tolerance docs/features.md states), and the seconds of each side
            (``last_checkpoints_s``: whether ``features.device: auto`` should send the ladder's small models to a
            GPU at all, where a kernel launch may cost more than their arithmetic)
  series    a Hugging Face checkpoint folder (a GPT-NeoX saved here with save_pretrained and a byte-level BPE
            tokenizer trained on the offline text) through the series path
            (topometrics.series.checkpoint.series_checkpoint_features) on the CPU and on the device: seconds of
            each and, per feature, the largest relative difference
  families  each feature family alone on one Pythia-160M-shaped checkpoint (bench.features.SURFACE_MODELS;
            its first loss-surface checkpoint, the validation batch of the offline corpus): seconds per family
            (``distance`` and ``trajectory`` need the previous checkpoint: their per-checkpoint part only),
            then all of them together (``together_s``; ``--families`` names which, e.g. all but the loss
            surface's two for what a checkpoint costs without it)
  monitor   a Pythia-70m-shaped training loop with the TopologyMonitor against the same loop without it
            (bench.monitor.measure)

At the full size the loss surface's trace is Hutchinson's with at most 16 probes on every model
(:data:`FULL_FEATURES`, in the JSON as ``features_overrides``), so that the check fits one GPU session. The JSON
is written after every section: a check stopped by a time limit keeps the sections it finished.

``--tiny`` runs the same code at a tiny size (the first two rungs for 40 steps, xl instead of the Pythia shapes,
20 monitored steps, 5 × 5 slices, ≤ 6 Lanczos steps, windows of 32 tokens in the series): what the test runs on
a CPU machine. ``--sections`` runs some of them (``features`` needs ``train``). Every section runs on one CPU
thread, as the stages' workers do. Prints one line per section and a last line naming
the JSON file with each section's seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import math
import platform
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from bench.features import SURFACE_MODELS
from bench.monitor import measure
from bench.train import project, time_rung
from topometrics.atomic import write_text
from topometrics.execution.compute import one_thread, usable_cores
from topometrics.features.checkpoint import checkpoint_features
from topometrics.features.forward import surface_batch, validation_batch
from topometrics.features.gradient_cloud import gradient_batch
from topometrics.features.sweep import RunShards, sweep_shards
from topometrics.models.checkpoints import list_checkpoints, load_state
from topometrics.models.model import GPT, GPTConfig, pick_device
from topometrics.models.tokens import encode, load_tokens
from topometrics.params import FEATURE_FAMILIES, FeaturesParams, ParamsError, load_params
from topometrics.series.checkpoint import series_checkpoint_features
from topometrics.series.hub import SeriesCheckpoint
from topometrics.training.corpus import offline_text
from topometrics.training.run_queue import RunFiles, plan_pool, train_runs
from topometrics.training.train import build_run_config

TINY_STEPS = 40
SECTIONS = ("train", "features", "series", "families", "monitor")
# The series section's GPT-NeoX: small enough that its CPU side (the reference) takes seconds at full settings
SERIES_SHAPE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 256}
# --tiny's feature settings: the same families on fewer points (the exact trace of the tiny rungs, one product per
# parameter, and 338 slice points would make the CPU test minutes long)
TINY_FEATURES = {"landscape_grid": 5, "hessian_iters": 6, "hessian_exact_max": 0, "hessian_probes_max": 16}
# The full size's trace: Hutchinson's with at most 16 probes on every model. At params.yaml's settings the tiny and
# small rungs take the exact trace (2,936 and 7,408 products a loss-surface checkpoint) and a random init's adaptive
# trace up to 400: tens of minutes of small products that say nothing more about the device than 16 do, in a
# check that must fit one GPU session. The JSON names the settings; a product's cost scales to the others.
FULL_FEATURES = {"hessian_exact_max": 0, "hessian_probes_max": 16}


def offline_corpus(root: Path) -> Path:
    """A prepared corpus directory (what the corpus stage writes: train.u8, val.u8, source.json) from the
    offline text, 90 % training, 10 % validation."""
    root.mkdir(parents=True, exist_ok=True)
    tokens = encode(offline_text())
    cut = int(0.9 * tokens.size)
    tokens[:cut].tofile(root / "train.u8")
    tokens[cut:].tofile(root / "val.u8")
    (root / "source.json").write_text(json.dumps({"sha256": "offline", "used": "python-docs-offline"}))
    return root


def longest_first_s(seconds: list[float], workers: int) -> float:
    """Wall seconds of whole jobs of ``seconds`` each, longest first to the first free of ``workers``."""
    finish = [0.0] * max(1, workers)
    for s in sorted(seconds, reverse=True):
        heapq.heapreplace(finish, finish[0] + s)
    return max(finish)


def train_section(params, root: Path, device: str, tiny: bool) -> dict:
    """The ladder trained through the run queue on ``device``, and the CPU's projection of the same runs."""
    rungs = list(params.ladder)[:2] if tiny else list(params.ladder)
    cfgs = [build_run_config(params, rung, params.train.seeds[0]) for rung in rungs]
    if tiny:
        recipe = {"steps": TINY_STEPS, "ckpt_every": TINY_STEPS // 2, "warmup": 5, "val_windows": 16}
        cfgs = [dataclasses.replace(c, recipe=dataclasses.replace(c.recipe, **recipe)) for c in cfgs]
    corpus = offline_corpus(root / "corpus")
    runs = [RunFiles(c, root / "runs" / c.name, root / "metrics" / f"{c.name}.json", root / "curves" / f"{c.name}.csv")
            for c in cfgs]  # fmt: skip
    pool = plan_pool(device, 0, 0, len(runs))
    start = time.perf_counter()
    summaries = train_runs(runs, corpus, pool, log=print)
    wall = time.perf_counter() - start
    same = retrained_identically(runs[0], corpus, device, root / "again")
    # one thread (run_section): as each process of the CPU queue runs
    cpu_run_s = {c.name: project(c, time_rung(c, "serial", 5, 2, torch.device("cpu"))) for c in cfgs}
    cores = usable_cores()
    cpu_queue_s = longest_first_s(list(cpu_run_s.values()), cores)
    per_run = {
        name: {k: s.get(k) for k in ("status", "device", "tokens_per_s", "final_val_loss", "checkpoints")}
        for name, s in summaries.items()
    }
    return {
        "pool": {"workers": pool.workers, "devices": list(pool.devices)},
        "runs_per_device": pool.workers / len(pool.devices),
        "runs": per_run,
        "wall_s": round(wall, 2),
        "cpu_run_s_one_thread": {k: round(v, 2) for k, v in cpu_run_s.items()},
        "cpu_queue_s": round(cpu_queue_s, 2),
        "cpu_cores": cores,
        "speedup_over_cpu_queue": round(cpu_queue_s / wall, 2) if wall > 0 else None,
        "retrained_bit_identical": same,
        "run_dirs": [str(r.run_dir) for r in runs],
        "corpus": str(corpus),
    }


def retrained_identically(run: RunFiles, corpus: Path, device: str, root: Path) -> dict:
    """``run`` trained again into ``root`` on ``device``: whether every checkpoint's tensors equal the first
    training's bit for bit (what resuming and moving a run between workers rely on), and how many differ."""
    again = RunFiles(run.config, root / run.run_dir.name, root / "metrics.json", root / "curves.csv")
    train_runs([again], corpus, plan_pool(device, 1, 0, 1), log=lambda line: None)
    first, second = list_checkpoints(run.run_dir), list_checkpoints(again.run_dir)
    differ = [a.step for a, b in zip(first, second, strict=True) if not _equal_states(a.path, b.path)]
    return {"run": run.config.name, "checkpoints": len(first), "identical": not differ, "differ_at_steps": differ}


def _equal_states(a: Path, b: Path) -> bool:
    left, right = load_state(a), load_state(b)
    return left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


def features_section(run_dirs: list[Path], corpus: Path, features: FeaturesParams, root: Path) -> dict:
    """Every checkpoint's features through the stage's path on ``features.device``, and the CPU against the
    device on each run's last checkpoint."""
    start = time.perf_counter()
    sweep_shards([RunShards(d, root / "shards" / d.name) for d in run_dirs], corpus, features, progress=print)
    wall = time.perf_counter() - start
    n_ckpts = sum(len(list_checkpoints(d)) for d in run_dirs)
    tokens = load_tokens(corpus, "val")
    worst: dict[str, float] = {}
    seconds = {"cpu": 0.0, "device": 0.0}  # the same checkpoints one at a time: is the device faster for them?
    for run_dir in run_dirs:
        last = list_checkpoints(run_dir)[-1]
        rows = {}
        for side, device in (("cpu", "cpu"), ("device", features.device)):
            start = time.perf_counter()
            rows[side] = _rows(load_state(last.path), last.config, tokens, dataclasses.replace(features, device=device))
            seconds[side] += time.perf_counter() - start
        for key, (a, b) in _paired(rows["cpu"], rows["device"]).items():
            worst[key[1]] = max(worst.get(key[1], 0.0), relative_difference(a, b))
    return {
        "device": str(pick_device(features.device, "features.device")),
        "checkpoints": n_ckpts,
        "wall_s": round(wall, 2),
        "s_per_checkpoint": round(wall / max(1, n_ckpts), 3),
        "last_checkpoints_s": {side: round(v, 2) for side, v in seconds.items()},  # one thread; with the surface
        "cpu_vs_device": dict(sorted(worst.items(), key=lambda kv: -kv[1])),
        "largest_difference": max(worst.values(), default=0.0),
    }


def series_section(root: Path, features: FeaturesParams, seq_len: int) -> dict:
    """One external checkpoint through the series path on the CPU and on ``features.device``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, PreTrainedTokenizerFast

    folder, text = root / "series" / "step100", offline_text()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)  # fmt: skip
    tok.train_from_iterator([text[:50_000]], trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(folder)
    torch.manual_seed(0)
    GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=300, **SERIES_SHAPE)).save_pretrained(folder)
    ckpt = SeriesCheckpoint(100, "step100", (folder / "model.safetensors",), folder, folder)
    rows, seconds = {}, {}
    for side, device in (("cpu", "cpu"), ("device", features.device)):
        start = time.perf_counter()
        result, _ = series_checkpoint_features(ckpt, text, dataclasses.replace(features, device=device), seq_len)
        rows[side], seconds[side] = result.rows, round(time.perf_counter() - start, 2)
    worst: dict[str, float] = {}
    for key, (a, b) in _paired(rows["cpu"], rows["device"]).items():
        worst[key[1]] = max(worst.get(key[1], 0.0), relative_difference(a, b))
    return {"model": "gpt_neox", **SERIES_SHAPE, "seconds": seconds,
            "cpu_vs_device": dict(sorted(worst.items(), key=lambda kv: -kv[1])),
            "largest_difference": max(worst.values(), default=0.0)}  # fmt: skip


def relative_difference(a: float, b: float) -> float:
    """``|a − b| / max(|a|, |b|)``; 0 when both are NaN or equal, infinity when only one is NaN."""
    if math.isnan(a) and math.isnan(b) or a == b:
        return 0.0
    if math.isnan(a) or math.isnan(b):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b))


def families_section(name: str, corpus: Path, features: FeaturesParams, families: tuple[str, ...]) -> dict:
    """Seconds of each of ``families`` alone on one random-init checkpoint of the ``name`` shape, then of all of
    them together (one checkpoint's features with exactly those families: what a checkpoint costs)."""
    config, state = random_checkpoint(name)
    tokens = load_tokens(corpus, "val")
    seconds = {}
    for family in families:
        start = time.perf_counter()
        _rows(state, config, tokens, dataclasses.replace(features, families=(family,)))
        seconds[family] = round(time.perf_counter() - start, 2)
        print(f"  families: {name} {family} {seconds[family]:.1f} s", flush=True)
    start, cpu = time.perf_counter(), time.process_time()
    _rows(state, config, tokens, dataclasses.replace(features, families=families))
    together, together_cpu = time.perf_counter() - start, time.process_time() - cpu
    print(f"  families: {name} all {len(families)} together {together:.1f} s ({together_cpu:.1f} s of CPU)", flush=True)
    return {"model": name, "n_params": sum(v.numel() for v in state.values()), "seconds": seconds,
            "total_s": round(sum(seconds.values()), 2), "together_s": round(together, 2),
            "together_cpu_s": round(together_cpu, 2)}  # fmt: skip


def random_checkpoint(name: str) -> tuple[GPTConfig, dict[str, torch.Tensor]]:
    """The config and state of our GPT at the ``name`` shape (:data:`SURFACE_MODELS`) with our 128-character
    vocabulary, GPT-2 initialised from seed 0."""
    config = dataclasses.replace(SURFACE_MODELS[name], vocab_size=128)
    model = GPT(config)
    model.init_weights(torch.Generator().manual_seed(0))
    return config, {k: v.detach().clone() for k, v in model.state_dict().items()}


def monitor_section(name: str, device: torch.device, tiny: bool) -> dict:
    """The training loop with and without the TopologyMonitor (bench.monitor.measure)."""
    steps, every = (20, 10) if tiny else (300, 100)
    args = argparse.Namespace(steps=steps, every=every, warmup=2, batch=4, context=128, surface=False)
    return measure(name, args, device)


def _rows(state: dict, config, tokens: np.ndarray, features: FeaturesParams) -> list:
    """The rows of one checkpoint at index 0 (a loss-surface checkpoint) on its validation batches."""
    batch = validation_batch(tokens, config.context, features.rep_batch)
    surface = surface_batch(tokens, config.context, features, 0)
    gradients = gradient_batch(tokens, config.context, features)
    return checkpoint_features(state, config, batch, features, surface, gradients=gradients).rows


def _paired(a: list, b: list) -> dict:
    """(layer, feature) -> (value on one device, value on the other), for the rows both have."""
    left = {(row[0], row[1]): float(row[2]) for row in a}
    return {key: (left[key], float(row[2])) for row in b if (key := (row[0], row[1])) in left}


def run_section(report: dict, name: str, fn, *args) -> object:
    """``fn(*args)`` into ``report[name]`` with its seconds, on one torch and BLAS thread as the stages' workers
    run (idle threads spinning on a shared machine cost more than they give at these sizes); a failure is
    recorded (one line and the traceback's last frames) and None returned, so the check goes on."""
    start = time.perf_counter()
    try:
        with one_thread():
            result = fn(*args)
        report[name] = dict(result) if isinstance(result, dict) else {"value": result}
    except Exception as err:  # noqa: BLE001 - a device check records every failure and goes on
        result = None
        report[name] = {"error": f"{type(err).__name__}: {err}".splitlines()[0],
                        "traceback": traceback.format_exc().splitlines()[-12:]}  # fmt: skip
    report[name]["section_s"] = round(time.perf_counter() - start, 2)
    print(f"device: {name} {'failed: ' + report[name]['error'] if 'error' in report[name] else 'done'} "
          f"in {report[name]['section_s']:.1f} s", flush=True)  # fmt: skip
    return result


def environment(device: torch.device) -> dict:
    info = {"torch": torch.__version__, "python": platform.python_version(), "device": str(device),
            "cuda": torch.version.cuda, "cores": usable_cores()}  # fmt: skip
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info |= {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                 "gpus": torch.cuda.device_count()}  # fmt: skip
    return info


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench device", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path("device.json"), help="the JSON file written")
    ap.add_argument("--tiny", action="store_true", help="the same code at a tiny size (the CPU test)")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="auto: CUDA when present")
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {','.join(SECTIONS)}")
    ap.add_argument("--families", default=",".join(FEATURE_FAMILIES), help="the families section's, comma-separated")
    args = ap.parse_args(argv)
    sections = [s for s in args.sections.split(",") if s]
    if unknown := [s for s in sections if s not in SECTIONS]:
        ap.error(f"--sections: unknown {unknown}; choose from {','.join(SECTIONS)}")
    families = tuple(f for f in args.families.split(",") if f)
    unknown = [f for f in families if f not in FEATURE_FAMILIES]
    if unknown or not families:
        what = f"unknown {unknown}" if unknown else "none given"
        ap.error(f"--families: {what}; choose from {','.join(FEATURE_FAMILIES)}")
    try:
        device = pick_device(args.device, "--device")
    except ParamsError as err:
        ap.error(str(err))
    params = load_params(args.params)
    features = dataclasses.replace(params.features, device=device.type, workers=max(1, usable_cores()))
    overrides = TINY_FEATURES if args.tiny else FULL_FEATURES
    features = dataclasses.replace(features, **overrides)
    big, small = ("xl", "xl") if args.tiny else ("pythia-160m-shaped", "pythia70m")
    report = {"tiny": args.tiny, "environment": environment(device), "features_overrides": overrides}

    def save() -> None:  # after every section: a check stopped by its time limit keeps what it finished
        write_text(args.out, json.dumps(report, indent=1, default=str) + "\n")

    with tempfile.TemporaryDirectory(prefix="bench-device-") as tmp:
        root = Path(tmp)
        trained = None
        if "train" in sections:
            trained = run_section(report, "train", train_section, params, root, device.type, args.tiny)
            save()
        if trained is not None and "features" in sections:
            run_dirs, corpus = [Path(d) for d in trained["run_dirs"]], Path(trained["corpus"])
            run_section(report, "features", features_section, run_dirs, corpus, features, root)
            save()
        if "series" in sections:
            seq_len = 32 if args.tiny else params.data.seq_len
            run_section(report, "series", series_section, root, features, seq_len)
            save()
        if "families" in sections:
            one = dataclasses.replace(features, workers=1)
            run_section(report, "families", families_section, big, offline_corpus(root / "corpus"), one, families)
            save()
        if "monitor" in sections:
            run_section(report, "monitor", monitor_section, small, device, args.tiny)
    save()
    seconds = ", ".join(f"{k} {v['section_s']:.0f} s" + (" (failed)" if "error" in v else "")
                        for k, v in report.items() if isinstance(v, dict) and "section_s" in v)  # fmt: skip
    print(f"device: wrote {args.out} ({report['environment']['device']}): {seconds}")
    return 1 if any("error" in v for v in report.values() if isinstance(v, dict)) else 0
