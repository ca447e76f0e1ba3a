"""Features speed on the default ladder: ``python -m bench features [--runs DIR]``.

Uses ``data/runs/<rung>-42`` (or the older ``data/runs/<rung>``) when all five default rungs exist there (and, unless
``--weights-only``, ``<corpus>/val.u8``), otherwise writes 255 synthetic checkpoints (51 per
rung, GPT-2 random init with a different seed per step) and a random ``val.u8`` into a
temporary directory. Measures (1) the weight-space features (NP, shuffled NP, Vietoris-Rips of
rows, spectral baselines) of all 255 checkpoints in a pool of ``--workers`` processes and (2)
the whole :func:`topometrics.features.run_shards.run_shards` per rung (weights, gradients,
representation topology, distances, written as shards into the temporary directory). Ends with one
JSON line, whose ``data`` says which checkpoints were measured (``real`` or ``synthetic``).
``--without a,b`` measures (2) again with those families switched off (``features.families``), in the same run,
and reports the ratio: ``--without landscape,curvature`` is what the loss-surface families add to the stage.

``--surface`` measures instead the loss-surface families of one loss-surface checkpoint (``landscape``: the two slices,
``curvature``: Lanczos + Hutchinson) for xl and a Pythia-70m-shaped model (6 layers, width 512, 8 heads,
context 128, our 128-character vocabulary) at the default ``features.*`` params, as ratios to one
forward+backward pass of the same model on the same loss-surface batch, timed in the same run: the smaller of two
medians of 5, one before and one after the families. On CPU every time is this process's CPU time
(``time.process_time``) on ``--threads`` (default 1) torch threads and one BLAS thread (as the stage's workers
run), so other work on a shared machine inflates neither side of a ratio (idle threads spinning under load
would). ``float64_gradients`` counts the curvature's gradients (one at the weights, one per Hessian product);
``total_fb`` is per loss-surface checkpoint, ``total_fb_per_ladder_checkpoint`` the same spread over every
checkpoint of a default-ladder run (``features.landscape_every``: 11 of its 51 checkpoints at the default k = 5).
``--surface-runs DIR ...`` adds the last checkpoint of each run folder, on the first windows of ``--corpus``'s
validation tokens (a trained checkpoint's Lanczos stops early; the random inits above run all ``hessian_iters`` steps).
``--central`` also times the curvature with central-difference products over all ``hessian_iters`` steps
(``curvature_central_all_steps_fb``: the products before one-sided differences and the early stop).
Each checkpoint also reports the trace beside the old fixed 8 Rademacher probes (:func:`trace_costs`: ``trace_fb``
against ``trace_old8_fb``, their ratio ``trace_cost_ratio``, the products, both relative standard errors and the
old estimate's error against the new), and the radius-1 global range's cost (``global_range_fb``, its share of
the landscape family).
A CUDA device is used when one is present (``--device``).

``--dynamics`` measures instead the training-dynamics families (``gradient_topology``, ``trajectory``,
``changepoints``) for the same two models, by the same method, and the gradient family's memory
(:mod:`bench.dynamics`).

``--models`` alone (without ``--surface`` or ``--dynamics``) measures instead every family's CPU seconds and peak
memory on one checkpoint of each named shape, each family in a fresh process, beside the cost model's estimate
(:mod:`bench.families`; ``--families a,b`` for fewer).

``--models`` (``a,b`` or ``a b``) picks from :data:`SURFACE_MODELS`: xl, and GPT-NeoX's Pythia-70m, -160m and
-410m block shapes (hidden 512 / 768 / 1024, 6 / 12 / 24 blocks, 8 / 12 / 16 heads) in our GPT with our
128-character vocabulary and context 128, not Pythia's 50k-token embedding; default xl and the 70m shape.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from bench import PARAMS_YAML
from bench.dynamics import dynamics_main
from bench.train import bench_clock, median_seconds, synchronize
from topometrics.execution.compute import map_jobs
from topometrics.features.checkpoint import weight_features
from topometrics.features.forward import loss_surface, validation_batch
from topometrics.features.run_shards import read_tables
from topometrics.features.sweep import run_shards
from topometrics.landscape.curvature import BASIS_BYTES, hutchinson_trace, top_eigenpairs
from topometrics.landscape.slice import random_direction
from topometrics.landscape.surface import (
    LANCZOS_TOL,
    SurfaceSettings,
    curvature_products,
    curvature_values,
    global_range,
    large_model,
    slice_values,
)
from topometrics.landscape.trace import Probes, hessian_trace
from topometrics.models.checkpoints import list_checkpoints, load_model, load_state, save_checkpoint
from topometrics.models.model import GPT, GPTConfig, linear_weights
from topometrics.models.tokens import load_tokens
from topometrics.params import FeaturesParams, load_params, run_name

LADDER = {"tiny": (8, 1), "small": (16, 1), "medium": (24, 2), "large": (32, 3), "xl": (48, 3)}
STEPS = range(0, 5001, 100)


def synthetic_runs(root: Path) -> tuple[Path, Path]:
    corpus = root / "corpus"
    corpus.mkdir(parents=True)
    np.random.default_rng(0).integers(0, 128, 200_000).astype(np.uint8).tofile(corpus / "val.u8")
    for rung, (hidden, layers) in LADDER.items():
        config = GPTConfig(hidden=hidden, layers=layers, heads=4)
        run = root / "runs" / rung
        run.mkdir(parents=True)
        for step in STEPS:
            model = GPT(config)
            model.init_weights(torch.Generator().manual_seed(step))
            meta = {
                "step": step,
                "rung": rung,
                "seed": 42,
                "config": config.to_dict(),
                "recipe_fingerprint": "bench",
                "val_loss": float("nan"),
                "train_loss": float("nan"),
            }
            save_checkpoint(run, model, meta)
    return root / "runs", corpus


def run_dir(runs: Path, rung: str) -> Path:
    """The default seed's run of ``rung``: ``<runs>/<rung>-42``, else a run dir from before train.seeds."""
    named = runs / run_name(rung, 42)
    return named if named.exists() else runs / rung


SURFACE_MODELS = {
    "xl": GPTConfig(hidden=48, layers=3, heads=4),
    "pythia-70m-shaped": GPTConfig(hidden=512, layers=6, heads=8),
    # GPT-NeoX's Pythia-160M and -410M block shapes in our GPT, with our 128-character vocabulary and context 128
    # (not Pythia's 50k-token embedding and context 2048): 85 M and 302 M linear weights
    "pythia-160m-shaped": GPTConfig(hidden=768, layers=12, heads=12),
    "pythia-410m-shaped": GPTConfig(hidden=1024, layers=24, heads=16),
}
DEFAULT_MODELS = ["xl", "pythia-70m-shaped"]  # the larger shapes take minutes each: named with --models


def model_names(values: list[str]) -> list[str]:
    """``--models``' names, space- or comma-separated (``a,b c``), each one of :data:`SURFACE_MODELS`."""
    names = [name for value in values for name in value.split(",") if name]
    unknown = [name for name in names if name not in SURFACE_MODELS]
    if unknown:
        raise SystemExit(f"unknown --models {unknown}; choose from {sorted(SURFACE_MODELS)}")
    return names


def surface_costs(
    config: GPTConfig,
    params: FeaturesParams,
    device: str = "cpu",
    model: GPT | None = None,
    tokens=None,
    central: bool = False,
) -> dict:
    """Seconds of one forward+backward pass, and of each loss-surface family, on one checkpoint: ``model`` on
    the validation ``tokens`` (a trained checkpoint), else a GPT-2 random init of ``config`` on random tokens.
    ``central``: also the curvature with central-difference products over all ``hessian_iters`` steps."""
    if model is None:
        tokens = np.random.default_rng(0).integers(0, 128, 200_000).astype(np.uint8)
        model = GPT(config)
        model.init_weights(torch.Generator().manual_seed(0))
    model.to(device)
    x, y = (t.to(device) for t in validation_batch(tokens, config.context, params.landscape_batch))

    def forward_backward():
        model.zero_grad(set_to_none=True)
        model.loss(x, y).backward()
        synchronize(torch.device(device))

    forward_backward()
    reference_before = median_seconds(forward_backward, device)
    _progress(f"forward+backward {reference_before:.3f} s")
    surface = loss_surface(model, (x, y))
    settings = SurfaceSettings(
        params.landscape_grid, params.landscape_radius, params.hessian_top, params.hessian_probes,
        params.hessian_iters, params.seed, exact_max=params.hessian_exact_max, trace_rse=params.hessian_trace_rse,
        probes_max=params.hessian_probes_max,
    )  # fmt: skip
    # one entry a gradient: float64, the one at the weights, then one per Hessian product; a large model's exact
    # float32 products (surface.large_model): one per window of the batch and product (each a double backward)
    gradients = []

    def counted(loss):
        def loss_counted(p):
            gradients.append(1)
            return loss(p)

        return loss_counted

    windows = [counted(window) for window in surface.windows]
    start = bench_clock(device)
    curvature, directions = curvature_values(counted(surface.loss), surface.params, settings, windows=windows)
    synchronize(torch.device(device))
    curvature_s = bench_clock(device) - start
    _progress(f"curvature {curvature_s:.1f} s ({curvature_s / reference_before:.0f} forward+backward)")
    gen = torch.Generator().manual_seed(params.seed)
    rand = (random_direction(surface.params, gen), random_direction(surface.params, gen))
    start = bench_clock(device)
    slice_values(surface.loss, surface.params, rand, settings)
    if not isinstance(directions, str):
        slice_values(surface.loss, surface.params, directions, settings)
    else:
        slice_values(surface.loss, surface.params, rand, settings)  # the same work, so the cost is counted
    global_range(surface.loss, surface.params, rand, settings)
    synchronize(torch.device(device))
    landscape_s = bench_clock(device) - start
    _progress(f"landscape {landscape_s:.1f} s ({landscape_s / reference_before:.0f} forward+backward)")
    start = bench_clock(device)
    global_range(surface.loss, surface.params, rand, settings)  # timed again alone: its share of the landscape
    synchronize(torch.device(device))
    global_s = bench_clock(device) - start
    trace = trace_costs(surface, settings, device, reference_before)
    central_s = _central_curvature_s(surface, settings, device) if central else float("nan")
    reference = min(reference_before, median_seconds(forward_backward, device))
    total = (landscape_s + curvature_s) / reference
    share = surface_checkpoints(params.landscape_every) / len(STEPS)
    return {
        "curvature_central_all_steps_fb": round(central_s / reference, 1),
        "device": device,
        "forward_backward_s": round(reference, 4),
        "landscape_s": round(landscape_s, 2),
        "curvature_s": round(curvature_s, 2),
        "float64_gradients": len(gradients),
        "products": "float32 exact, per window" if large_model(_size(surface), settings) else "float64 one-sided",
        "landscape_fb": round(landscape_s / reference, 1),
        "curvature_fb": round(curvature_s / reference, 1),
        "total_fb": round(total, 1),
        # every checkpoint of a default-ladder run, the share of them that are loss-surface checkpoints
        "total_fb_per_ladder_checkpoint": round(total * share, 1),
        "unconverged": sorted(curvature.reasons),
        "global_range_fb": round(global_s / reference, 1),
        "global_range_share_of_landscape": round(global_s / landscape_s, 3),
    } | trace


def trace_costs(surface, settings: SurfaceSettings, device: str, reference: float) -> dict:
    """The trace's cost and precision on one checkpoint: the old 8 Rademacher probes beside
    :func:`topometrics.landscape.trace.hessian_trace` at the ``features.hessian_*`` params, on the same one-sided
    products, deflated by the Lanczos eigenvectors of the same checkpoint (computed here, not timed).
    ``trace_rse``: the reported standard error over the trace (0 when exact); ``trace_old8_rse``: the 8 probes'
    own standard error over their estimate; ``trace_cost_ratio``: new seconds over old."""
    hvp, dim, dtype = curvature_products(surface.loss, surface.params, settings, surface.windows)
    large = dtype == np.float32  # the large-model path (surface.large_model): float32, two passes (in memory here)
    k, steps = max(settings.top, 2), settings.iters
    eig = top_eigenpairs(hvp, dim, k, steps, settings.seed, LANCZOS_TOL, True, 0 if large else BASIS_BYTES, dtype)
    start = bench_clock(device)
    old = hutchinson_trace(hvp, dim, 8, settings.seed)
    old_s = bench_clock(device) - start
    start = bench_clock(device)
    probes = Probes(settings.probes, settings.trace_rse, settings.probes_max)
    new = hessian_trace(hvp, dim, settings.exact_max, probes, settings.seed, eig.vectors, dtype)
    new_s = bench_clock(device) - start
    _progress(f"trace {new.trace:.4g}+-{new.stderr:.2g}, {new.products} products {new_s:.1f} s; 8 probes {old_s:.1f} s")
    return {
        "parameters": dim,
        "trace_exact": dim <= settings.exact_max,
        "trace": round(new.trace, 4),
        "trace_rse": round(new.stderr / abs(new.trace), 4),
        "trace_products": new.products,
        "trace_fb": round(new_s / reference, 1),
        "trace_old8": round(old.trace, 4),
        "trace_old8_rse": round(old.stderr / abs(old.trace), 4),
        "trace_old8_error": round(old.trace / new.trace - 1, 4),
        "trace_old8_fb": round(old_s / reference, 1),
        "trace_cost_ratio": round(new_s / old_s, 1),
    }


def _progress(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)  # a large model takes minutes a family


def _central_curvature_s(surface, settings: SurfaceSettings, device: str) -> float:
    start = bench_clock(device)
    curvature_values(surface.loss, surface.params, settings, one_sided=False, stop_early=False)
    synchronize(torch.device(device))
    return bench_clock(device) - start


def _size(surface) -> int:
    return sum(p.numel() for p in surface.params.values())


def surface_checkpoints(every: int) -> int:
    """Loss-surface checkpoints of a default-ladder run (:data:`STEPS`: indices 0, k, 2k, ...)."""
    return len(range(0, len(STEPS), every))


def _weights_job(job: tuple[Path, int, FeaturesParams]):
    path, layers, params = job
    return weight_features(linear_weights(load_state(path), layers), params)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench features")
    parser.add_argument("--runs", type=Path, default=Path("data/runs"))
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--weights-only", action="store_true", help="skip the whole-stage measurement")
    parser.add_argument("--surface", action="store_true", help="the loss-surface families' cost per checkpoint")
    parser.add_argument("--dynamics", action="store_true", help="the training-dynamics families' cost (bench.dynamics)")
    parser.add_argument("--models", nargs="*", help="a,b or a b: of SURFACE_MODELS (alone: each family's cost)")
    parser.add_argument("--families", default="", help="--models alone: these families (a,b; default all)")
    parser.add_argument("--central", action="store_true", help="--surface: also central products, all steps")
    parser.add_argument("--surface-runs", type=Path, nargs="*", default=[], help="also their last checkpoints")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for --surface (CPU time is per thread)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="for --surface")
    parser.add_argument("--without", default="", help="also the whole stage without these families (a,b): the ratio")
    parser.add_argument("--no-layer-memory", action="store_true", help="--dynamics: skip the layer-by-layer memory")
    args = parser.parse_args(argv)
    if args.models is not None and not (args.surface or args.dynamics):
        from bench import families  # imports this module: not at the top

        return families.main(model_names(args.models), args.families, PARAMS_YAML)
    args.models = model_names(args.models or DEFAULT_MODELS)
    params = dataclasses.replace(load_params(PARAMS_YAML).features, workers=args.workers)
    if args.dynamics:
        models = {name: SURFACE_MODELS[name] for name in args.models}
        return dynamics_main(models, SURFACE_MODELS["xl"], params, args.threads, args.device, not args.no_layer_memory)
    if args.surface:
        torch.set_num_threads(args.threads)
        found = {}
        # BLAS on one thread, as in the features stage's workers (execution.compute): Lanczos' vector
        # operations on two BLAS threads spun 20x the CPU time of one on this loaded machine
        with threadpool_limits(limits=1, user_api="blas"):
            for name in args.models:
                found[name] = surface_costs(SURFACE_MODELS[name], params, args.device, central=args.central)
                print(f"{name}: {found[name]}", flush=True)
            tokens = load_tokens(args.corpus, "val") if args.surface_runs else None
            for run in args.surface_runs:  # trained checkpoints: the last of each run, on the real batch
                last = list_checkpoints(run)[-1]
                name = f"{run.name}@{last.step}"
                found[name] = surface_costs(last.config, params, args.device, load_model(last), tokens, args.central)
                print(f"{name}: {found[name]}", flush=True)
        print(json.dumps({"threads": torch.get_num_threads(), **found}))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        runs, corpus = args.runs, args.corpus
        dirs = {rung: run_dir(runs, rung) for rung in LADDER}
        # The weight features need no corpus: --weights-only measures a real ladder without one.
        need_corpus = not args.weights_only
        if not all(list_checkpoints(d) for d in dirs.values()) or (need_corpus and not (corpus / "val.u8").exists()):
            print("no complete data/runs ladder: writing 255 synthetic checkpoints")
            runs, corpus = synthetic_runs(Path(tmp))
            dirs = {rung: runs / rung for rung in LADDER}
            data = "synthetic"
        else:
            data = "real"
        ckpts = [(c.path, c.config.layers, params) for d in dirs.values() for c in list_checkpoints(d)]
        start = time.perf_counter()
        map_jobs(_weights_job, ckpts, workers=params.workers, label="weights")
        weights_s = time.perf_counter() - start
        print(f"weight features, {len(ckpts)} checkpoints: {weights_s:.1f} s")
        if args.weights_only:
            print(json.dumps({"weight_features_s_255": round(weights_s, 2), "checkpoints": len(ckpts), "data": data}))
            return 0
        stage_s = whole_stage(dirs, corpus, params, Path(tmp) / "shards")
        print(f"whole features, {len(ckpts)} checkpoints: {stage_s:.1f} s")
        without = [name for name in args.without.split(",") if name]
        if without:  # the same stage without some families, in the same run: the ratio is what they cost
            fewer = dataclasses.replace(params, families=tuple(f for f in params.families if f not in without))
            fewer_s = whole_stage(dirs, corpus, fewer, Path(tmp) / "shards-without")
            extra = {"features_stage_s_without": round(fewer_s, 2), "without": without}
            extra["features_stage_ratio"] = round(stage_s / fewer_s, 2)
            print(f"whole features without {', '.join(without)}: {fewer_s:.1f} s -> {stage_s / fewer_s:.2f}x")
    print(
        json.dumps(
            {
                "weight_features_s_255": round(weights_s, 2),
                "features_stage_s_255": round(stage_s, 2),
                "checkpoints": len(ckpts),
                "workers": params.workers,
                "data": data,
            }
            | (extra if without else {})
        )
    )
    return 0


def whole_stage(dirs: dict[str, Path], corpus: Path, params: FeaturesParams, out: Path) -> float:
    """Wall seconds of the features stage's work (:func:`run_shards`) on every rung's run folder into ``out``."""
    start = time.perf_counter()
    for rung, folder in dirs.items():
        t0 = time.perf_counter()
        run_shards(folder, corpus, params, out / rung)
        features, diagrams = read_tables(out / rung)
        print(f"features@{rung}: {time.perf_counter() - t0:.1f} s, {len(features)} rows, {len(diagrams)} bars")
    return time.perf_counter() - start
