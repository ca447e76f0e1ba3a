"""Training throughput per rung and the projected wall time of the default ladder.

    python -m bench train [--steps 20] [--rungs tiny,xl] [--modes naive,serial,serial2,parallel]
                          [--cores N] [--device auto|cpu|cuda] [--sweep RUNGS:VARIANTS:SEEDS:STEPS[:CKPT_EVERY] ...]
                          [--bpe 512,2048]

Every mode times the real training step (sample a batch, forward, backward, clip, AdamW
step with the schedule's learning rate) on random tokens (the cost does not depend on
the text), after ``--warmup`` untimed steps, and adds the amortised cost of a checkpoint
(validation on the fixed windows + writing checkpoint and resume state) every
``ckpt_every`` steps. Modes:

  naive     the plain eager loop as first written (default AdamW, torch's default threads):
            the reference every ratio is taken against, measured in the same run
  serial    this repo's loop (topometrics.training.train) with params.yaml's ``train.threads``
            (0 = torch's default, one per core), rungs one after another: what
            ``dvc repro`` runs, and the mode of ``projected_ladder_minutes``
  serial1   the same with 1 thread (opt-in)      serial2   ... with 2 threads (opt-in)
  compile2  serial2 with ``torch.compile`` on the loss, compile time counted (opt-in)
  parallel  one 1-thread process per core (``--cores``, default: the usable cores), rungs spread
            over them, timed while all run: each rung's per-thread rate with every core busy

The projection of one run is steps x median step time + checkpoints x checkpoint time. From the
``parallel`` rates (always measured) the last JSON line also holds, for the whole ladder:

  serial_ladder_min   rungs one after another with params' threads: the old one-stage-per-run repro
  repro_ladder_min    ``dvc repro`` now: topometrics.training.run_queue's schedule (its own longest-first order
                      from estimated FLOPs, one process per core) plus the measured pool start-up
  hand_schedule_min   the best hand schedule of whole runs over the same cores (exhaustive)
  gemm_floor_min      the same schedule constraint (whole runs, one thread each) with only the
                      training's matrix products, timed alone: the time no loop overhead can beat
  projection          repro and hand minutes for 8 and 16 cores from the same per-thread rates

With ``train.sketch_every`` > 0 the JSON line also holds ``sketch``: per rung, one trajectory sketch's time
(topometrics.training.sketch) and its ``overhead``, that time over ``sketch_every`` steps of the loop
``dvc repro`` runs (timed above, same process), and the one-off time to draw the projection matrix.

``--sweep tiny,small,medium:4:8:1000:50`` (repeatable) also projects a sweep of rungs x variants x seeds
runs of that many steps, a checkpoint every CKPT_EVERY (default: params' ``train.ckpt_every``)
(``sweeps`` in the JSON; bench.schedule.sweep_projection): on CPU from the
``parallel`` rates over ``--cores`` processes plus the pool start-up; on CUDA from the ``serial`` rates,
one run after another on the GPU (the run queue's concurrent runs per GPU are not timed here, so it is
an upper bound).

``--device`` (default ``auto``: CUDA when present) is where the model, batches and optimizer live; on
CUDA every step ends with a device synchronisation so the timer sees the kernels, the thread modes are
the same single process, and ``parallel`` (one CPU process per core) and the CPU schedules are skipped.

``--bpe N,...`` also times each rung with a byte-level BPE vocabulary of N tokens (data.tokenizer: {kind: bpe,
vocab_size: N}; the same shape, a larger embedding and head) in the ``serial`` loop, interleaved with the
character rung, and reports ``bpe``: each one's step time and its ratio to the character rung's.

The machine is shared, so read ratios measured in the same run rather than absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.schedule import (
    best_makespan,
    gemm_seconds_per_step,
    parse_sweep,
    pool_startup_s,
    queue_makespan,
    sweep_projection,
)
from topometrics.execution.compute import usable_cores
from topometrics.models.checkpoints import save_checkpoint
from topometrics.models.model import GPT, pick_device
from topometrics.params import ParamsError, load_params
from topometrics.training.run_dir import save_resume
from topometrics.training.run_queue import estimated_flops
from topometrics.training.sketch import sketch
from topometrics.training.train import (
    RunConfig,
    build_run_config,
    evaluate,
    forward_backward,
    make_optimizer,
    sample_batch,
    validation_windows,
)

MODES = ("naive", "serial", "serial1", "serial2", "compile2", "parallel")
DEFAULT_MODES = ("naive", "serial", "parallel")


def _tokens(n: int, seed: int, vocab: int = 128) -> np.ndarray:
    """Random ids as the corpus stores them (uint8 for characters, uint16 for a BPE above 256 ids)."""
    return np.random.default_rng(seed).integers(0, vocab - 1, n, dtype=np.uint8 if vocab <= 256 else np.uint16)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued kernels (CUDA runs them asynchronously; a CPU step is done when it returns)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_clock(device: str) -> float:
    """Seconds: this process's CPU time on CPU (other processes on a shared machine do not count), else wall time."""
    return time.perf_counter() if device.startswith("cuda") else time.process_time()


def median_seconds(fn, device: str = "cpu", repeats: int = 5) -> float:
    """Median of ``repeats`` timings of ``fn()`` on :func:`bench_clock`."""
    times = []
    for _ in range(repeats):
        start = bench_clock(device)
        fn()
        times.append(bench_clock(device) - start)
    return float(np.median(times))


def time_rung(cfg: RunConfig, mode: str, steps: int, warmup: int, device: torch.device | None = None) -> dict:
    """Median step time and checkpoint time (seconds) of one rung in one mode, in this process, on ``device``
    (default CPU); batches are sampled on the CPU and moved, as the trainer does."""
    r, seq_len, device = cfg.recipe, cfg.model.context, device or torch.device("cpu")
    torch.manual_seed(0)
    model = GPT(cfg.model)
    model.init_weights(torch.Generator().manual_seed(r.seed))
    model.to(device).train()
    data = torch.from_numpy(_tokens(1 << 20, 1, cfg.model.vocab_size))
    gen = torch.Generator().manual_seed(r.seed + 1)
    if mode == "naive":  # the loop as first written: default (for-each) AdamW, no helpers
        opt = torch.optim.AdamW(model.parameters(), lr=r.lr, weight_decay=r.weight_decay)

        def step(s: int) -> None:
            for group in opt.param_groups:
                group["lr"] = r.lr_schedule.at(s)
            x, y = (t.to(device) for t in sample_batch(data, r.batch_size, seq_len, gen))
            loss = model.loss(x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), r.grad_clip).item()
            loss.item()
            opt.step()
            synchronize(device)
    else:
        opt = make_optimizer(model, r)
        if mode.startswith("compile"):
            model.loss = torch.compile(model.loss)

        def step(s: int) -> None:
            for group in opt.param_groups:
                group["lr"] = r.lr_schedule.at(s)
            x, y = (t.to(device) for t in sample_batch(data, r.batch_size, seq_len, gen))
            forward_backward(model, opt, x, y, r.grad_clip)
            opt.step()
            synchronize(device)

    t0 = time.perf_counter()
    for s in range(1, warmup + 1):
        step(s)
    warm_s = time.perf_counter() - t0
    times = []
    for s in range(warmup + 1, warmup + steps + 1):
        t = time.perf_counter()
        step(s)
        times.append(time.perf_counter() - t)
    step_s = statistics.median(times)
    val_windows_cpu = validation_windows(_tokens(200_000, 2, cfg.model.vocab_size), r.val_windows, seq_len)
    val_x, val_y = (t.to(device) for t in val_windows_cpu)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = []
        for i in range(2):
            t = time.perf_counter()
            val = evaluate(model, val_x, val_y, r.batch_size)
            save_checkpoint(Path(tmp), model, {"step": i, "rung": cfg.rung, "val_loss": val, "train_loss": val})
            save_resume(Path(tmp), model, opt, gen, {"step": i, "loss_sum": 0.0})
            ckpt.append(time.perf_counter() - t)
    return {
        "step_s": step_s,
        "ckpt_s": min(ckpt),
        "extra_s": max(0.0, warm_s - warmup * step_s),  # compile time and other one-off costs
    }


def sketch_overhead(cfg: RunConfig, step_s: float, every: int, dim: int, reps: int = 20) -> dict:
    """The trajectory sketch's cost on training (topometrics.training.sketch, as the train stage records it): the
    median time of one sketch of the rung's weights over ``every`` steps of ``step_s`` seconds (the sparse
    projection is drawn as it is applied: no one-off matrix)."""
    model = GPT(cfg.model)
    model.init_weights(torch.Generator().manual_seed(cfg.recipe.seed))
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        sketch(model, dim, 0)
        times.append(time.perf_counter() - t)
    sketch_s = statistics.median(times)
    return {"sketch_ms": sketch_s * 1e3, "overhead": sketch_s / (every * step_s)}


def project(cfg: RunConfig, t: dict) -> float:
    """Seconds for the rung's whole default run: every step, every checkpoint (step 0 too), one-offs."""
    r = cfg.recipe
    return r.steps * t["step_s"] + (r.steps // r.ckpt_every + 1) * t["ckpt_s"] + t["extra_s"]


def _worker(cfgs: list[dict], steps: int, warmup: int, done, n_workers: int, out) -> None:
    """Time the given rungs with 1 thread, then keep the core busy until every worker is done."""
    torch.set_num_threads(1)
    results = {}
    for d in cfgs:
        cfg = RunConfig.from_dict(d)
        results[cfg.rung] = time_rung(cfg, "serial1", steps, warmup)
    with done.get_lock():
        done.value += 1
    out.put(results)
    busy = RunConfig.from_dict(cfgs[-1])
    while done.value < n_workers:  # the other worker is still timing: keep loading the machine
        time_rung(busy, "serial1", 2, 0)


def time_parallel(cfgs: dict[str, RunConfig], single: dict[str, float], steps: int, warmup: int, cores: int) -> tuple:
    """``cores`` 1-thread processes; rungs assigned longest first to the least loaded worker."""
    loads, plan = [0.0] * cores, [[] for _ in range(cores)]
    for rung in sorted(cfgs, key=lambda k: -single[k]):
        w = loads.index(min(loads))
        plan[w].append(rung)
        loads[w] += single[rung]
    ctx = mp.get_context("spawn")
    done, out = ctx.Value("i", 0), ctx.Queue()
    plan = [p for p in plan if p]
    procs = [
        ctx.Process(target=_worker, args=([cfgs[k].to_dict() for k in p], steps, warmup, done, len(plan), out))
        for p in plan
    ]
    for p in procs:
        p.start()
    results = {}
    for _ in procs:
        results |= out.get()
    for p in procs:
        p.join()
    return results, plan


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench train", description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20, help="timed steps per rung and mode (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    ap.add_argument("--rungs", default="", help="comma-separated rungs (default: the whole ladder)")
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated, from {','.join(MODES)}")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--cores", type=int, default=usable_cores(), help="processes of the parallel mode and queue")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="auto: CUDA when present")
    ap.add_argument(
        "--sweep", action="append", default=[], help="project RUNGS:VARIANTS:SEEDS:STEPS[:CKPT_EVERY] (repeatable)"
    )
    ap.add_argument("--bpe", default="", help="comma-separated BPE vocabulary sizes to time beside each rung")
    args = ap.parse_args(argv)
    bpe_sizes = [int(v) for v in args.bpe.split(",") if v]
    modes = [m for m in args.modes.split(",") if m]
    if unknown := set(modes) - set(MODES):
        ap.error(f"unknown modes {sorted(unknown)}; choose from {MODES}")
    try:
        device, sweeps = pick_device(args.device), [parse_sweep(text) for text in args.sweep]
    except (ParamsError, ValueError) as err:
        ap.error(str(err))
    cuda = device.type == "cuda"
    if "naive" not in modes:
        modes.insert(0, "naive")
    if "parallel" not in modes and not cuda:
        modes.append("parallel")
    if cuda and "parallel" in modes:
        modes.remove("parallel")  # one CPU process per core: not a GPU mode
    params = load_params(args.params)
    rungs = args.rungs.split(",") if args.rungs else list(params.ladder)
    rungs += [k for sweep in sweeps for k in sweep[0] if k not in rungs]
    cfgs = {k: build_run_config(params, k, params.train.seeds[0]) for k in rungs}
    default_threads = torch.get_num_threads()
    threads = {"naive": default_threads, "serial": params.train.threads or default_threads}
    threads |= {"serial1": 1, "serial2": 2, "compile2": 2}

    t_start = time.perf_counter()
    timing: dict[str, dict[str, dict]] = {m: {} for m in modes}
    bpe: dict[str, dict[str, dict]] = {}
    for rung, cfg in cfgs.items():  # modes interleaved per rung: they see the same background load
        for mode in modes:
            if mode == "parallel":
                continue
            torch.set_num_threads(threads[mode])
            timing[mode][rung] = time_rung(cfg, mode, args.steps, args.warmup, device)
            print(f"  {rung:8s} {mode:9s} {timing[mode][rung]['step_s'] * 1e3:8.1f} ms/step", flush=True)
        if bpe_sizes:
            bpe[rung] = bpe_rungs(params, rung, bpe_sizes, threads["serial"], args.steps, args.warmup)
    torch.set_num_threads(default_threads)
    plan = None
    if "parallel" in modes:
        single = {k: project(cfgs[k], timing.get("serial", timing["naive"])[k]) for k in cfgs}
        timing["parallel"], plan = time_parallel(cfgs, single, args.steps, args.warmup, args.cores)

    tokens_per_step = {k: cfgs[k].recipe.batch_size * cfgs[k].model.context for k in cfgs}
    minutes, tok_s = {}, {}
    for mode in modes:
        per_rung = {k: project(cfgs[k], timing[mode][k]) for k in cfgs}
        if mode == "parallel":
            minutes[mode] = max(sum(per_rung[k] for k in p) for p in plan) / 60
        else:
            minutes[mode] = sum(per_rung.values()) / 60
        tok_s[mode] = {k: tokens_per_step[k] / timing[mode][k]["step_s"] for k in cfgs}

    steps = next(iter(cfgs.values())).recipe.steps
    print(f"\ntraining throughput, {len(cfgs)} rungs x {steps} steps (median of {args.steps} steps; tokens/s)")
    print(f"{'rung':8s} " + " ".join(f"{m:>12s}" for m in modes) + "   ckpt ms (serial)")
    for k in cfgs:
        ck = timing.get("serial", timing["naive"])[k]["ckpt_s"] * 1e3
        print(f"{k:8s} " + " ".join(f"{tok_s[m][k]:12,.0f}" for m in modes) + f"   {ck:8.0f}")
    print(f"{'ladder':8s} " + " ".join(f"{minutes[m]:10.1f} m" for m in modes) + "   (projected minutes)")
    print(f"{'vs naive':8s} " + " ".join(f"{minutes['naive'] / minutes[m]:11.2f}x" for m in modes))
    if plan:
        print(f"parallel plan (1 thread each): {plan}")
    dvc_mode = "serial" if "serial" in modes else "naive"
    result = {
        "projected_ladder_minutes": round(minutes[dvc_mode], 2),
        "mode": dvc_mode,
        "tokens_per_s": {k: round(v) for k, v in tok_s[dvc_mode].items()},
        "naive_projected_ladder_minutes": round(minutes["naive"], 2),
        "naive_tokens_per_s": {k: round(v) for k, v in tok_s["naive"].items()},
        "speedup_vs_naive": round(minutes["naive"] / minutes[dvc_mode], 3),
        "modes": {
            m: {
                "projected_ladder_minutes": round(minutes[m], 2),
                "speedup_vs_naive": round(minutes["naive"] / minutes[m], 3),
                "tokens_per_s": {k: round(v) for k, v in tok_s[m].items()},
                "ckpt_ms": {k: round(timing[m][k]["ckpt_s"] * 1e3, 1) for k in cfgs},
                "one_off_s": {k: round(timing[m][k]["extra_s"], 1) for k in cfgs},
            }
            for m in modes
        },
        "parallel_plan": plan,
        "threads": {m: threads.get(m, 1) for m in modes},
        "timed_steps": args.steps,
        "device": str(device) + (f" ({torch.cuda.get_device_name(device)})" if cuda else ""),
    }
    if params.train.sketch_every > 0:  # the sketch against the loop dvc repro runs, timed above in this process
        every, dim = params.train.sketch_every, params.train.sketch_dim
        torch.set_num_threads(threads[dvc_mode])
        costs = {k: sketch_overhead(cfgs[k], timing[dvc_mode][k]["step_s"], every, dim) for k in cfgs}
        torch.set_num_threads(default_threads)
        result["sketch"] = {"every": every, "dim": dim} | {
            k: {key: round(v, 4) for key, v in c.items()} for k, c in costs.items()
        }
        for k, c in costs.items():
            print(f"sketch {k:8s} {c['sketch_ms']:7.2f} ms per sketch, {100 * c['overhead']:.2f} % of {every} steps")
    if not cuda:
        result |= ladder_schedules(cfgs, timing, minutes, params.train.seeds[0], args.cores)
    result["sweeps"] = sweep_projections(sweeps, timing, params.train.ckpt_every, 1 if cuda else args.cores)
    if bpe:
        result["bpe"] = bpe
    result["bench_seconds"] = round(time.perf_counter() - t_start, 1)
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result, sort_keys=True))
    return 0


def sweep_projections(sweeps: list[tuple], timing: dict, ckpt_every: int, workers: int) -> list[dict]:
    """:func:`bench.schedule.sweep_projection` of each sweep, printed: from the ``parallel`` rates and the
    measured pool start-up on CPU, from the ``serial`` rates one run at a time on a GPU (``workers`` 1)."""
    if not sweeps:
        return []
    rates = timing.get("parallel") or timing.get("serial", timing["naive"])
    startup = pool_startup_s(workers) if "parallel" in timing else 0.0
    out = []
    for sweep in sweeps:
        p = sweep_projection(rates, sweep, ckpt_every, workers, startup)
        print(
            f"sweep {','.join(p['rungs'])} x {p['variants']} variants x {p['seeds']} seeds x {p['steps']} steps = "
            f"{p['runs']} runs: {p['wall_hours']} h on {workers} process(es) ({p['run_hours_total']} run-hours)"
        )
        out.append(p)
    return out


def bpe_rungs(params, rung: str, sizes: list[int], threads: int, steps: int, warmup: int) -> dict[str, dict]:
    """Step time of ``rung`` with characters and with each BPE vocabulary size, interleaved (same load), in the
    serial loop: ``{"char": {step_ms}, "<N>": {step_ms, vs_char}}``."""
    torch.set_num_threads(threads)
    times = {"char": []}
    for _ in range(3):  # alternate so that a change in background load falls on every vocabulary alike
        for vocab in [128, *sizes]:
            cfg = build_run_config(params, rung, params.train.seeds[0], vocab_size=vocab)
            key = "char" if vocab == 128 else str(vocab)
            times.setdefault(key, []).append(time_rung(cfg, "serial", steps, warmup)["step_s"])
    char = statistics.median(times["char"])
    out = {"char": {"step_ms": round(char * 1e3, 2)}}
    for key, values in times.items():
        if key != "char":
            out[key] = {
                "step_ms": round(statistics.median(values) * 1e3, 2),
                "vs_char": round(statistics.median(values) / char, 3),
            }
            print(f"  {rung:8s} bpe {key:>6s} {out[key]['step_ms']:8.1f} ms/step, {out[key]['vs_char']:.2f}x char")
    return out


def ladder_schedules(cfgs: dict[str, RunConfig], timing: dict, minutes: dict, seed: int, cores: int) -> dict:
    """Serial, queue (``dvc repro``), best-hand and GEMM-floor minutes of the ladder, and projections."""
    per_run = {k: project(cfgs[k], timing["parallel"][k]) for k in cfgs}  # 1 thread, every core busy
    queue_order = sorted(cfgs, key=lambda k: -estimated_flops(cfgs[k]))  # what run_queue does
    torch.set_num_threads(1)
    gemm = {k: cfgs[k].recipe.steps * gemm_seconds_per_step(cfgs[k]) for k in cfgs}
    startup = pool_startup_s(min(cores, len(cfgs)))

    def queue(c: int) -> float:
        return (startup + queue_makespan([per_run[k] for k in queue_order], c)) / 60

    repro, hand = queue(cores), best_makespan(list(per_run.values()), cores) / 60
    floor = max(sum(gemm.values()) / cores, max(gemm.values())) / 60
    serial = minutes.get("serial", minutes["naive"])
    print(
        f"\nwhole runs on {cores} cores, 1 thread each (minutes): serial {serial:.1f}, repro (queue) {repro:.1f}, "
        f"best hand schedule {hand:.1f}, GEMM floor {floor:.1f}; repro / hand {repro / hand:.3f}, "
        f"repro / floor {repro / floor:.2f}, pool start-up {startup:.1f} s"
    )
    projection = {
        str(c): {"repro_ladder_min": round(queue(c), 2), "hand_schedule_min": round(best_makespan(
            list(per_run.values()), c) / 60, 2)} for c in (8, 16)
    }  # fmt: skip
    return {
        "serial_ladder_min": round(serial, 2),
        "repro_ladder_min": round(repro, 2),
        "hand_schedule_min": round(hand, 2),
        "gemm_floor_min": round(floor, 2),
        "repro_vs_hand": round(repro / hand, 3),
        "repro_vs_gemm_floor": round(repro / floor, 2),
        "cores": cores,
        "pool_startup_s": round(startup, 1),
        "run_minutes_1thread": {k: round(v / 60, 2) for k, v in per_run.items()},
        "gemm_minutes_1thread": {k: round(v / 60, 2) for k, v in gemm.items()},
        "projection": projection,
    }
