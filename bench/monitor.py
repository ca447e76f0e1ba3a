"""Overhead of live monitoring: the same training loop with and without a TopologyMonitor.

    python -m bench monitor [--steps 300] [--every 100] [--models xl,pythia70m] [--surface]

For each model the loop (random tokens, forward, backward, clip, AdamW step) runs ``--steps``
steps three times after ``--warmup`` untimed ones: without the monitor, with it (``every``
steps: copy the linear weights to CPU, weight features in the background process), and without
again. The overhead is the monitored time over the mean of the two plain times, minus one, so
a machine that speeds up or slows down during the run shows in the two plain times. The
monitored time ends with the loop; waiting for the last measurement afterwards is reported
apart (``drain_s``). ``blocked_s`` is the time the loop spent inside ``monitor.step`` (the
copies and hand-over: all the loop waits for), ``features_s`` the worker's time per measurement
(on another core when one is free; on a busy machine it competes with training). ``--surface``
also computes the loss surface (``landscape``, ``curvature``) at every measurement
(``features.landscape_every`` set to 1: the worst case) on ``features.landscape_batch`` random windows,
and reports ``surface_s`` per measurement and ``surface_over_step`` (one measurement's loss surface
over one plain training step), and, load-robust, ``surface_cpu_over_step_cpu``: the CPU time of the
worker's computation (``monitor_surface.surface_rows``) over one training step's, both here on one
thread, interleaved, medians of 3. Models:

  xl         the ladder's xl rung (hidden 48, 3 blocks, context 128), params.yaml's batch size
  pythia70m  a GPT-NeoX with Pythia-70m's shape (hidden 512, 6 blocks, MLP 2048, vocab 50304),
             built from its config with random weights (nothing downloaded); ``--batch`` windows
             of ``--context`` tokens

The last line is JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from topometrics.features.monitor import TopologyMonitor
from topometrics.features.monitor_surface import SurfaceSource, due_batch, model_snapshot, surface_rows
from topometrics.models.model import GPT
from topometrics.params import load_params
from topometrics.training.train import build_run_config

PYTHIA_70M = {"hidden_size": 512, "num_hidden_layers": 6, "num_attention_heads": 8, "intermediate_size": 2048,
              "vocab_size": 50304, "max_position_embeddings": 2048, "rotary_pct": 0.25}  # fmt: skip


def build(name: str, batch: int, context: int, device: torch.device):
    """The model, its optimizer, a loss function of random token batches, and its vocabulary and context."""
    gen = torch.Generator().manual_seed(0)
    if name == "xl":
        params = load_params()
        cfg = build_run_config(params, "xl", params.train.seeds[0])
        model = GPT(cfg.model)
        model.init_weights(gen)
        vocab, batch, context = cfg.model.vocab_size, cfg.recipe.batch_size, cfg.model.context

        def loss_of(x):
            return model.loss(x[:, :-1], x[:, 1:])
    else:
        from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

        model = GPTNeoXForCausalLM(GPTNeoXConfig(**PYTHIA_70M))
        vocab = PYTHIA_70M["vocab_size"]

        def loss_of(x):
            return model(input_ids=x, labels=x).loss

    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, vocab, (batch, context + 1), generator=gen).to(device)
    return model, opt, lambda: loss_of(tokens), vocab, context


def loop(model, opt, loss_fn, first: int, steps: int, monitor: TopologyMonitor | None, device) -> tuple[float, float]:
    """Seconds for ``steps`` training steps numbered from ``first`` (monitor called after each update),
    and the seconds of those spent inside ``monitor.step`` (what the loop waits for: the copies)."""
    _sync(device)
    start, blocked = time.perf_counter(), 0.0
    for step in range(first, first + steps):
        loss = loss_fn()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if monitor is not None:
            _sync(device)
            t = time.perf_counter()
            monitor.step(model, step, loss=None)
            blocked += time.perf_counter() - t
    _sync(device)
    return time.perf_counter() - start, blocked


def cpu_ratio(model, opt, loss_fn, surface: SurfaceSource, params, device) -> float:
    """CPU seconds of the worker's loss surface of ``model`` over one training step's, on one thread here."""
    threads, steps, surfaces = torch.get_num_threads(), [], []
    torch.set_num_threads(1)
    try:
        for _ in range(3):
            start = time.process_time()
            loop(model, opt, loss_fn, 1, 1, None, device)
            steps.append(time.process_time() - start)
            start = time.process_time()
            surface_rows(model_snapshot(model, due_batch(surface, params, 0, 1)), params)
            surfaces.append(time.process_time() - start)
    finally:
        torch.set_num_threads(threads)
    print(f"one thread, CPU: a training step {statistics.median(steps):.3f} s, the loss surface "
          f"{statistics.median(surfaces):.2f} s", flush=True)  # fmt: skip
    return round(statistics.median(surfaces) / statistics.median(steps), 1)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(name: str, args, device: torch.device) -> dict:
    model, opt, loss_fn, vocab, context = build(name, args.batch, args.context, device)
    loop(model, opt, loss_fn, 1, args.warmup, None, device)
    first = args.warmup + 1
    plain1, _ = loop(model, opt, loss_fn, first, args.steps, None, device)
    with tempfile.TemporaryDirectory() as tmp:
        lines, params, surface = [], load_params().features, None
        if args.surface:
            params = dataclasses.replace(params, landscape_every=1)
            ids = torch.randint(0, vocab, (params.landscape_batch * context + 1,), generator=torch.Generator())
            surface = SurfaceSource(ids.numpy(), context)
        monitor = TopologyMonitor(Path(tmp), args.every, params, name, log=lines.append, surface=surface)
        monitor.step(model, 0)  # the worker starts (and imports) before the timed loop, as in a real run's first step
        monitor.collect(wait=True)
        first += args.steps
        watched, blocked = loop(model, opt, loss_fn, first, args.steps, monitor, device)
        start = time.perf_counter()
        monitor.close()
        drain = time.perf_counter() - start
        measured, skipped = len(monitor.measured) - 1, len(monitor.skipped)
    plain2, _ = loop(model, opt, loss_fn, first + args.steps, args.steps, None, device)
    plain = statistics.mean([plain1, plain2])
    row = {"model": name, "steps": args.steps, "every": args.every, "plain_s": [round(plain1, 3), round(plain2, 3)]}
    row |= {"monitored_s": round(watched, 3), "overhead": round(watched / plain - 1, 4), "drain_s": round(drain, 2)}
    row |= {"measurements": measured, "skipped": skipped, "step_ms": round(1000 * plain / args.steps, 2)}
    row |= {"blocked_s": round(blocked, 4), "blocked_share": round(blocked / watched, 5)}
    row |= {"features_s": [float(line.rsplit("features ", 1)[1].split(" s")[0]) for line in lines[1:]]}
    if args.surface:
        row["surface_s"] = [float(line.rsplit("loss surface ", 1)[1].split(" s")[0]) for line in lines]
        row["surface_over_step"] = round(statistics.median(row["surface_s"]) / (plain / args.steps), 1)
        row["surface_cpu_over_step_cpu"] = cpu_ratio(model, opt, loss_fn, surface, params, device)
    print(f"{name}: {args.steps} steps plain {plain1:.2f} / {plain2:.2f} s, monitored {watched:.2f} s "
          f"-> overhead {100 * row['overhead']:+.1f} % ({measured} measurements, {skipped} skipped, "
          f"drain {drain:.1f} s); the loop waited {blocked:.3f} s in monitor.step ({100 * blocked / watched:.2f} %)",
          flush=True)  # fmt: skip
    return row


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench monitor", description=__doc__)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--models", default="xl,pythia70m")
    ap.add_argument("--batch", type=int, default=4, help="pythia70m: windows per batch")
    ap.add_argument("--context", type=int, default=128, help="pythia70m: tokens per window")
    ap.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    ap.add_argument("--threads", type=int, default=0, help="torch threads of the training loop (0: torch's default)")
    ap.add_argument("--surface", action="store_true", help="also the loss surface at every measurement")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)  # fmt: skip
    rows = [measure(name, args, device) for name in args.models.split(",")]
    print(json.dumps({"device": str(device), "threads": torch.get_num_threads(), "models": rows}))
    return 0
