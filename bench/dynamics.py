"""The three training-dynamics families' cost per checkpoint: ``python -m bench features --dynamics``.

For xl and a Pythia-70m-shaped model (``bench.features.SURFACE_MODELS``) at the default ``features.*`` and
``train.*`` params, the seconds each family adds to one checkpoint, as ratios to one forward+backward pass of
the same model on the same batch (the ``features.grad_batch`` gradient windows), timed in the same run: the
smaller of two medians of 5, one before and one after the families (the method of ``--surface``).

``gradient_topology``  :func:`topometrics.features.gradient_cloud.gradient_rows` (per-example gradients per
                       layer, the clouds' persistence, the whole network's projection, the baseline);
``trajectory``         one checkpoint's iterate (:class:`topometrics.features.trajectory.CheckpointIterate`, done
                       once per checkpoint and kept with its shard) and its two trailing-window dimensions (a
                       window of ``phdim_window / sketch_every`` sketched iterates and one of 11 checkpoints);
``changepoints``       one run's changepoint rows (51 checkpoints, 10 series) over its 51 checkpoints.

And what a features run spends on a run's checkpoint iterates (51 xl checkpoints): reloading and projecting
every checkpoint, as each run did before, against reading each one's iterate from its shard (now).

Every time on CPU is this process's CPU time (``time.process_time``) on ``--threads`` torch threads.

**Memory** (CPU): in a fresh process per model, the peak resident memory (``ru_maxrss``) after the model and a
forward+backward pass of the batch, then after the gradient family: the difference is what the family needs
above a forward+backward pass; set against ``grad_batch`` x the largest linear layer (float32), the memory of
one layer's per-example gradients. Twice: with glibc's default allocator (``memory``), and with a fixed mmap
threshold (``memory_freed_blocks_returned``: every freed large block goes back to the system, so the peak is
the family's live allocations rather than the heap the default allocator keeps).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from bench.train import bench_clock, median_seconds, synchronize
from topometrics.dynamics.changepoints import run_changepoint_rows
from topometrics.execution.shards import Fingerprint, ShardKey, Task, write_shard
from topometrics.features.gradient_cloud import gradient_batch, gradient_cloud, gradient_rows, weight_names
from topometrics.features.run_shards import shard_iterates
from topometrics.features.trajectory import Iterates, checkpoint_iterates, trajectory_values
from topometrics.models.checkpoints import list_checkpoints, load_state, save_checkpoint
from topometrics.models.model import GPT, GPTConfig, linear_layer_names, linear_modules, linear_weights
from topometrics.params import FeaturesParams, TrainParams

CHECKPOINTS = 51  # a default run's checkpoints (changepoints are per run)


def _model(config: GPTConfig, device: str) -> GPT:
    model = GPT(config)
    model.init_weights(torch.Generator().manual_seed(0))
    return model.to(device)


def _batch(config: GPTConfig, params: FeaturesParams, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, 200_000).astype(np.uint8)
    found = gradient_batch(tokens, config.context, params)
    assert not isinstance(found, str), found
    return tuple(t.to(device) for t in found)


def random_walk(steps: np.ndarray, dim: int, seed: int) -> Iterates:
    """A seeded Gaussian random walk ``(len(steps), dim)`` at ``steps``: iterates to time the fits on."""
    return Iterates(steps, np.cumsum(np.random.default_rng(seed).standard_normal((steps.size, dim)), axis=0))


def dynamics_costs(config: GPTConfig, params: FeaturesParams, train: TrainParams, device: str = "cpu") -> dict:
    """Seconds of one forward+backward pass on the gradient batch and of each family's work on one checkpoint."""
    model, (x, y) = _model(config, device), _batch(config, params, device)
    dev = torch.device(device)

    def forward_backward():
        model.zero_grad(set_to_none=True)
        model.loss(x, y).backward()
        synchronize(dev)

    forward_backward()
    reference_before = median_seconds(forward_backward, device)
    model.zero_grad(set_to_none=True)
    layers = linear_layer_names(config.layers)
    cloud = gradient_cloud(model, weight_names(model, linear_modules(model)), (x, y))
    start = bench_clock(device)
    rows = gradient_rows(cloud, layers, params)
    synchronize(dev)
    gradient_s = bench_clock(device) - start
    nulls = sorted({reason for _, _, reason in rows if reason})
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    start = bench_clock(device)
    iterate = checkpoint_iterates([0], [linear_weights(state, config.layers).values()], params.seed)
    iterate_s = bench_clock(device) - start
    every = max(train.sketch_every, 1)
    step = params.phdim_window
    sketch = random_walk(np.arange(every, step + 1, every), train.sketch_dim, 1)
    ckpts = random_walk(np.linspace(0, step, 11).astype(np.int64), iterate.points.shape[1], 2)
    start = bench_clock(device)
    values = trajectory_values(sketch, ckpts, step, params)
    fit_s = bench_clock(device) - start
    grid = np.arange(CHECKPOINTS)
    series = {f"f{i}": (grid, random_walk(grid, 1, i).points[:, 0]) for i in range(9)}
    series["val_loss"] = (np.arange(CHECKPOINTS), np.linspace(4, 2, CHECKPOINTS))
    start = time.process_time()
    run_changepoint_rows(series, "val_loss", (np.arange(CHECKPOINTS), np.linspace(1, 0, CHECKPOINTS)))
    changepoint_s = (time.process_time() - start) / CHECKPOINTS
    reference = min(reference_before, median_seconds(forward_backward, device))
    trajectory_s = iterate_s + fit_s
    total = gradient_s + trajectory_s + changepoint_s
    return {
        "device": device,
        "forward_backward_s": round(reference, 4),
        "gradient_topology_s": round(gradient_s, 3),
        "trajectory_s": round(trajectory_s, 3),
        "trajectory_iterate_s": round(iterate_s, 3),
        "changepoints_s": round(changepoint_s, 5),
        "gradient_topology_fb": round(gradient_s / reference, 1),
        "trajectory_fb": round(trajectory_s / reference, 2),
        "changepoints_fb": round(changepoint_s / reference, 3),
        "total_fb": round(total / reference, 1),
        "null_reasons": nulls + [r for _, _, r in values if r],
    }


def iterate_reads(config: GPTConfig, params: FeaturesParams, root: Path, n: int = CHECKPOINTS) -> dict:
    """CPU seconds a features run spends on a run's checkpoint iterates: reloading and projecting ``n`` saved
    checkpoints of ``config`` (what every run did before), against reading them back from ``n`` shards'
    metadata (``run_shards.shard_iterates``, now); both give the same iterates (checked)."""
    ckpts, tasks = [], []
    (root / "run").mkdir(parents=True)
    for step in range(n):
        model = GPT(config)
        model.init_weights(torch.Generator().manual_seed(step))
        meta = {"step": step, "rung": "xl", "seed": 42, "config": config.to_dict(), "recipe_fingerprint": "bench"}
        save_checkpoint(root / "run", model, meta | {"val_loss": float("nan"), "train_loss": float("nan")})
    ckpts = list_checkpoints(root / "run")
    start = time.process_time()
    layers = (linear_weights(load_state(c.path), c.config.layers).values() for c in ckpts)
    before = checkpoint_iterates([c.step for c in ckpts], layers, params.seed)
    reload_s = time.process_time() - start
    frame = pd.DataFrame({"step": [0], "value": [0.0]})
    for step, point in zip(before.steps, before.points, strict=True):
        key = ShardKey("xl", "base", 42, int(step))
        write_shard(root / "shards", key, Fingerprint("-", "-", "-"), {"features": frame}, {"iterate": list(point)})
        tasks.append(Task(key, Fingerprint("-", "-", "-"), None))
    start = time.process_time()
    after = shard_iterates(root / "shards", tasks)
    read_s = time.process_time() - start
    assert np.array_equal(after.points, before.points), "the shards' iterates differ from the checkpoints'"
    return {"checkpoints": n, "reload_and_project_s": round(reload_s, 3), "from_shards_s": round(read_s, 4)}


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def _memory(config: GPTConfig, params: FeaturesParams) -> dict:
    model, (x, y) = _model(config, "cpu"), _batch(config, params, "cpu")
    model.loss(x, y).backward()
    model.zero_grad(set_to_none=True)
    small = GPT(GPTConfig(hidden=8, layers=1, heads=2))  # loads what the family imports lazily (ripser, torch.func)
    gradient_rows(gradient_cloud(small, weight_names(small, linear_modules(small)), (x, y)), ["x"], params)
    base = _peak_mb()
    names = weight_names(model, linear_modules(model))
    cloud = gradient_cloud(model, names, (x, y))
    gradient_rows(cloud, linear_layer_names(config.layers), params)
    sizes = {layer: dict(model.named_parameters())[name].numel() for layer, name in names.items()}
    bound = params.grad_batch * max(sizes.values()) * 4 / 2**20
    above = _peak_mb() - base
    return {"peak_above_fb_mb": round(above, 1), "grad_batch_x_largest_layer_mb": round(bound, 1),
            "ratio": round(above / bound, 2)}  # fmt: skip


def _child(task: str, config: GPTConfig, params: FeaturesParams, threads: int, device: str, queue) -> None:
    torch.set_num_threads(threads)
    if task == "memory":
        queue.put(_memory(config, params))
    elif task == "iterates":
        with tempfile.TemporaryDirectory() as tmp:
            queue.put(iterate_reads(config, params, Path(tmp)))
    else:
        queue.put(dynamics_costs(config, params, TrainParams(), device))


def in_fresh_process(
    task: str, config: GPTConfig, params: FeaturesParams, threads: int, device: str, env: dict | None = None
) -> dict:
    """``task`` ('costs' or 'memory') in a fresh process whose BLAS and OpenMP pools have ``threads`` threads
    (numpy's BLAS sizes its pool when loaded; idle pool threads spinning would count as this process's CPU time),
    so a peak resident size is its own; ``env``: more variables for it (e.g. glibc's malloc settings)."""
    saved = dict(os.environ)
    os.environ.update({var: str(threads) for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
    os.environ.update(env or {})
    try:
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        child = ctx.Process(target=_child, args=(task, config, params, threads, device, queue))
        child.start()
        found = queue.get()
        child.join()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return found


def dynamics_main(models: list[str], params: FeaturesParams, threads: int, device: str) -> int:
    """``--dynamics``: each model's costs and memory, a line each, then one JSON line."""
    from bench.features import SURFACE_MODELS  # bench.features dispatches here

    found = {}
    for name in models:
        found[name] = in_fresh_process("costs", SURFACE_MODELS[name], params, threads, device)
        if device == "cpu":
            config = SURFACE_MODELS[name]
            found[name]["memory"] = in_fresh_process("memory", config, params, threads, device)
            # glibc's default raises its mmap threshold as large blocks are freed, so later ones come from the
            # heap and may stay resident after they are freed; a fixed threshold returns every freed block,
            # so the peak is the family's own live allocations
            returned = in_fresh_process("memory", config, params, threads, device, {"MALLOC_MMAP_THRESHOLD_": "131072"})
            found[name]["memory_freed_blocks_returned"] = returned
        print(f"{name}: {found[name]}", flush=True)
    found["iterates_per_features_run"] = in_fresh_process("iterates", SURFACE_MODELS["xl"], params, threads, "cpu")
    print(f"iterates: {found['iterates_per_features_run']}")
    print(json.dumps({"threads": threads, **found}))
    return 0
