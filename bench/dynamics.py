"""The three training-dynamics families' cost per checkpoint: ``python -m bench features --dynamics``.

For xl and a Pythia-70m-shaped model (``bench.features.SURFACE_MODELS``, passed in; ``--models`` names others, e.g. the
Pythia-160m and -410m shapes, as ``a,b`` or ``a b``) at the default ``features.*`` and
``train.*`` params, the seconds each family adds to one checkpoint, as ratios to one forward+backward pass of
the same model on the same batch (the ``features.grad_batch`` gradient windows), timed in the same run: the
smaller of two medians of 5, one before and one after the families (the method of ``--surface``).

``gradient_topology``  :func:`topometrics.features.gradient_cloud.gradient_rows` (per-example gradients per
                       layer, the clouds' persistence, the whole network's projection, the baseline);
``trajectory``         one checkpoint's iterate (:class:`topometrics.dynamics.trajectory.CheckpointIterate`, done
                       once per checkpoint and kept with its shard) and its two trailing-window dimensions (a
                       window of ``phdim_window / sketch_every`` sketched iterates and one of 11 checkpoints);
``changepoints``       one run's changepoint rows (51 checkpoints, 10 series) over its 51 checkpoints.

And what a features run spends on a run's checkpoint iterates (51 xl checkpoints): reloading and projecting
every checkpoint, as each run did before, against reading each one's iterate from its shard (now).

Every time on CPU is this process's CPU time (``time.process_time``) on ``--threads`` torch threads. The
costs' process also reads its resident memory (``VmHWM``, the counter of ``ru_maxrss``): each family's
high-water mark above what was resident as it started (``*_peak_mb``; near 0 when the heap kept from the
reference passes serves it) and the process's whole peak (``process_peak_mb``: model, batch, imports,
activations, the family).

**Memory, layer by layer** (CPU, :func:`layer_memory`; ``--no-layer-memory`` skips it): in a fresh process
per model, resident memory above the model (its
resident size before the measured work), from ``/proc/self/status`` (``VmRSS`` now, ``VmHWM`` the high-water
mark, the same counter as ``ru_maxrss``), the mark lowered to the resident size before each part by writing
``5`` to ``/proc/self/clear_refs``: a plain forward+backward pass of the batch (what its forward keeps for the
backward, and its peak), then the gradient family layer by layer: each linear layer's peak while its
per-example gradients are computed and summarised, above what was resident as it started (the layer's own
memory), set against ``grad_batch`` x the layer's weights x bytes per element (its per-example gradients,
whole). Twice: with glibc's default allocator (``memory``), and with a fixed mmap threshold
(``memory_freed_blocks_returned``: every freed block of 128 kB or more goes back to the system, so a peak is
live allocations rather than the heap the default allocator keeps; the target is judged on this one).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from bench import PARAMS_YAML
from bench.train import bench_clock, median_seconds, synchronize
from topometrics.dynamics.changepoints import run_changepoint_rows
from topometrics.dynamics.trajectory import Iterates, checkpoint_iterates, trajectory_values
from topometrics.execution.shards import Fingerprint, ShardKey, Task, write_shard
from topometrics.features.gradient_cloud import gradient_batch, gradient_cloud, gradient_rows, weight_names
from topometrics.features.run_shards import shard_iterates
from topometrics.landscape.gradients import example_loss, gradient_topology
from topometrics.models.checkpoints import list_checkpoints, load_state, save_checkpoint
from topometrics.models.model import GPT, GPTConfig, linear_layer_names, linear_modules, linear_weights
from topometrics.params import FeaturesParams, TrainParams, load_params

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
    base, peak = _peak_start()
    start = bench_clock(device)
    rows = gradient_rows(cloud, layers, params)
    synchronize(dev)
    gradient_s = bench_clock(device) - start
    gradient_peak = _peak_above(base, peak)
    nulls = sorted({reason for _, _, reason in rows if reason})
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    base, peak = _peak_start()
    start = bench_clock(device)
    iterate = checkpoint_iterates([0], [linear_weights(state, config.layers).values()], params.seed)
    iterate_s = bench_clock(device) - start
    iterate_peak = _peak_above(base, peak)
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
        "gradient_topology_peak_mb": gradient_peak,
        "trajectory_iterate_peak_mb": iterate_peak,
        "process_peak_mb": _mb(rss_kb_peak_total()),
        "null_reasons": nulls + [r for _, _, r in values if r],
    }


def _peak_start() -> tuple[int, int]:
    """Resident kB now, and the process's high-water mark so far (kept: :func:`reset_peak` lowers it)."""
    now, peak = rss_kb()
    reset_peak()
    return now, peak


def _peak_above(base: int, before: int) -> float:
    """MB of the high-water mark since :func:`_peak_start` above the resident size then; the process's whole
    mark (``ru_maxrss``) is kept as ``max(before, now)`` for :func:`rss_kb_peak_total`."""
    global _PEAK_TOTAL
    peak = rss_kb()[1]
    _PEAK_TOTAL = max(_PEAK_TOTAL, before, peak)
    return _mb(peak - base)


_PEAK_TOTAL = 0  # the process's high-water mark across the resets of _peak_start, kB


def rss_kb_peak_total() -> int:
    """The process's resident high-water mark (kB) over its whole life, the resets included."""
    return max(_PEAK_TOTAL, rss_kb()[1])


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


def rss_kb() -> tuple[int, int]:
    """This process's resident size now and its high-water mark since the last :func:`reset_peak` (or its
    start), kB (``VmRSS``, ``VmHWM`` of ``/proc/self/status``; the latter is ``ru_maxrss``)."""
    found = {}
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(("VmRSS:", "VmHWM:")):
                found[line[:5]] = int(line.split()[1])
    return found["VmRSS"], found["VmHWM"]


def reset_peak() -> None:
    """Lower the high-water mark to the resident size now (Linux >= 4.0: ``5`` into ``/proc/self/clear_refs``),
    so the next :func:`rss_kb` peak is that of what runs in between."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


class LayerPeaks:
    """``around`` for :func:`topometrics.landscape.gradients.gradient_topology`: each layer's resident size as
    its per-example gradients start (``entry``) and its high-water mark while they are computed and summarised
    (``peak``), kB; ``between`` the highest mark outside the layers (the family's forward and backward pass)."""

    def __init__(self) -> None:
        self.layers: dict[str, tuple[int, int]] = {}
        self.between = 0

    @contextlib.contextmanager
    def __call__(self, layer: str):
        self.between = max(self.between, rss_kb()[1])
        reset_peak()
        entry = rss_kb()[1]  # the mark just lowered, read from the same counter as the peak
        yield
        self.layers[layer] = (entry, rss_kb()[1])
        reset_peak()

    def peak(self) -> int:
        """The highest mark over the layers and in between them, kB (call after the family)."""
        return max([self.between, rss_kb()[1], *(peak for _, peak in self.layers.values())])


def _mb(kb: float) -> float:
    return round(kb / 1024, 2)


def layer_memory(model: GPT, x: torch.Tensor, y: torch.Tensor, params: FeaturesParams) -> dict:
    """The gradient family's resident memory on ``model`` and its batch ``x``, ``y`` (grad_batch, t), layer by
    layer, in MB above the model (the resident size before any of this, batch and imports included).

    ``forward_backward``: a plain forward+backward pass of the same batch: what its forward keeps for the
    backward (``activations_mb``, resident with the graph alive) and its peak (``peak_mb``: activations, the
    backward's buffers and every parameter's ``.grad``, ``parameters_mb``; the family's own pass computes only
    the biases' gradients when every linear layer has one, and stores none).
    ``layers``, one row per linear layer in the order they are computed: ``bound_mb`` = ``grad_batch`` x the
    layer's weights x bytes per element (its per-example gradients, whole); ``at_entry_mb`` what is resident
    above the model when the layer starts (the family's backward pass so far); ``peak_mb`` its high-water mark
    above the model while the layer's gradients are computed and summarised; ``own_mb`` = peak - entry, the
    layer's own memory: what the target (``own_mb`` <= ``grad_batch`` x the largest layer) is judged on.
    """
    names = weight_names(model, linear_modules(model))
    weights = {layer: model.get_parameter(name) for layer, name in names.items()}
    model.zero_grad(set_to_none=True)
    base = rss_kb()[0]
    reset_peak()
    loss = model.loss(x, y)
    activations = rss_kb()[0] - base
    loss.backward()
    del loss
    fb_peak = rss_kb()[1] - base
    model.zero_grad(set_to_none=True)
    reset_peak()
    peaks = LayerPeaks()
    pairs = {name: p.detach() for name, p in model.named_parameters()}
    gradient_topology(example_loss(model), pairs, names, x, y, params.grad_dim, params.seed, model, peaks)
    rows = []
    for layer, (entry, peak) in peaks.layers.items():
        w = weights[layer]
        bound = params.grad_batch * w.numel() * w.element_size() / 1024
        rows.append(
            {
                "layer": layer,
                "numel": w.numel(),
                "bound_mb": _mb(bound),
                "at_entry_mb": _mb(entry - base),
                "peak_mb": _mb(peak - base),
                "own_mb": _mb(peak - entry),
                "own_over_bound": round((peak - entry) / bound, 2),
            }
        )
    largest = max(row["bound_mb"] for row in rows)
    own = max(row["own_mb"] for row in rows)
    parameters = sum(p.numel() * p.element_size() for p in model.parameters()) / 1024
    return {
        "forward_backward": {
            "activations_mb": _mb(activations),
            "peak_mb": _mb(fb_peak),
            "parameters_mb": _mb(parameters),
        },
        "layers": rows,
        "family_peak_mb": _mb(peaks.peak() - base),
        "peak_above_fb_mb": _mb(peaks.peak() - base - fb_peak),
        "grad_batch_x_largest_layer_mb": largest,
        "largest_own_mb": own,
        "layers_within_own_bound": sum(row["own_mb"] <= row["bound_mb"] for row in rows),
        "target_met": own <= largest,
    }


def _memory(config: GPTConfig, params: FeaturesParams) -> dict:
    model, (x, y) = _model(config, "cpu"), _batch(config, params, "cpu")
    small = GPT(GPTConfig(hidden=8, layers=1, heads=2))  # loads what the family imports lazily (ripser, torch.func)
    layer_memory(small, x, y, params)
    model.loss(x, y).backward()  # the first pass's one-off allocations (thread pools, kernels' caches)
    return layer_memory(model, x, y, params)


def _child(task: str, config: GPTConfig, params: FeaturesParams, threads: int, device: str, queue) -> None:
    torch.set_num_threads(threads)
    if task == "memory":
        queue.put(_memory(config, params))
    elif task == "iterates":
        with tempfile.TemporaryDirectory() as tmp:
            queue.put(iterate_reads(config, params, Path(tmp)))
    else:
        queue.put(dynamics_costs(config, params, load_params(PARAMS_YAML).train, device))


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


def print_memory(title: str, memory: dict) -> None:
    """:func:`layer_memory`'s rows as a table: one line per layer, then the forward+backward pass and the family."""
    columns = {"numel": 9, "bound_mb": 8, "at_entry_mb": 11, "peak_mb": 8, "own_mb": 7, "own_over_bound": 14}
    print(f"{title}: MB above the model")
    print(f"  {'layer':<18}" + "".join(f" {key:>{width}}" for key, width in columns.items()))
    for row in memory["layers"]:
        print(f"  {row['layer']:<18}" + "".join(f" {row[key]:>{width}}" for key, width in columns.items()))
    fb = memory["forward_backward"]
    print(f"  forward+backward: activations {fb['activations_mb']}, peak {fb['peak_mb']} (.grad {fb['parameters_mb']})")
    verdict = "met" if memory["target_met"] else "NOT met"
    print(
        f"  family peak {memory['family_peak_mb']}; largest own {memory['largest_own_mb']} against grad_batch x "
        f"the largest layer {memory['grad_batch_x_largest_layer_mb']}: {verdict}"
    )


def dynamics_main(
    models: dict[str, GPTConfig], xl: GPTConfig, params: FeaturesParams, threads: int, device: str, layers: bool = True
) -> int:
    """``--dynamics``: each model's costs and (``layers``) its layer-by-layer memory, a line each, then one JSON
    line (``models``: name -> shape, as bench.features names them; ``xl``: the rung whose features run reads its
    checkpoints' iterates). The costs' process also reports each family's resident peak above what was resident as
    it started (``*_peak_mb``) and its own whole peak (``process_peak_mb``: model, batch and imports included)."""
    found = {}
    for name, config in models.items():
        found[name] = in_fresh_process("costs", config, params, threads, device)
        if device == "cpu" and layers:
            found[name]["memory"] = in_fresh_process("memory", config, params, threads, device)
            # glibc's default raises its mmap threshold as large blocks are freed, so later ones come from the
            # heap and may stay resident after they are freed; a fixed threshold returns every freed block,
            # so the peak is the family's own live allocations
            returned = in_fresh_process("memory", config, params, threads, device, {"MALLOC_MMAP_THRESHOLD_": "131072"})
            found[name]["memory_freed_blocks_returned"] = returned
            for allocator in ("memory", "memory_freed_blocks_returned"):
                print_memory(f"{name} {allocator}", found[name][allocator])
        print(f"{name}: {found[name]}", flush=True)
    found["iterates_per_features_run"] = in_fresh_process("iterates", xl, params, threads, "cpu")
    print(f"iterates: {found['iterates_per_features_run']}")
    print(json.dumps({"threads": threads, **found}))
    return 0
