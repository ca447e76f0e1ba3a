"""The loss surface's memory at the Pythia shapes: peak resident memory and CPU time of the curvature, per model.

    python -m bench curvature [--models pythia-70m-shaped,pythia-410m-shaped] [--whole-surface] [--out FILE]

Each model runs in a fresh process (so each peak is its own: ``ru_maxrss``), one torch thread, on a random init
of :data:`bench.features.SURFACE_MODELS` and random tokens at the ``features.*`` params of ``params.yaml``:

- default: the curvature family (``surface.curvature_values``: Lanczos, the deflated trace) as the features
  stage runs it, with every Hessian-vector product counted and timed;
- ``--whole-surface``: both slices, the global range and the slices' curvature too (``surface.surface_values``),
  with Lanczos cut at ``k`` steps (3) and its Ritz values taken as converged, so that the ``hess`` slice runs on a
  random init (whose clustered top eigenvalues never converge in 20 steps): the memory path of the defaults, not
  their values or time.

Prints one line per model and a JSON summary: parameters, peak RSS before the family (the model and batch) and
at its end, CPU seconds, products and seconds per product, the family's NULL reasons.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench import PARAMS_YAML
from bench.features import SURFACE_MODELS, model_names
from topometrics.features.forward import loss_surface
from topometrics.landscape import surface
from topometrics.models.model import GPT
from topometrics.params import load_params


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(name: str, whole_surface: bool) -> dict:
    """One model's curvature (or whole surface) in this process; see the module docstring."""
    torch.set_num_threads(1)
    params = load_params(PARAMS_YAML).features
    model = GPT(SURFACE_MODELS[name])
    model.init_weights(torch.Generator().manual_seed(0))
    tokens = torch.Generator().manual_seed(1)
    x, y = (torch.randint(0, 128, (params.landscape_batch, 128), generator=tokens) for _ in range(2))
    found = loss_surface(model, (x, y))
    settings = surface.SurfaceSettings(
        3 if whole_surface else params.landscape_grid, params.landscape_radius, params.hessian_top,
        params.hessian_probes, params.hessian_iters, params.seed, exact_max=params.hessian_exact_max,
        trace_rse=params.hessian_trace_rse, probes_max=params.hessian_probes,
    )  # fmt: skip
    seconds = []
    checked = surface._finite

    def timed(hvp):
        inner = checked(hvp)

        def product(v):
            start = time.process_time()
            out = inner(v)
            seconds.append(time.process_time() - start)
            return out

        return product

    surface._finite = timed  # count and time every product the family makes (restored below)
    real = surface.top_eigenpairs
    if whole_surface:
        surface.top_eigenpairs = lambda hvp, dim, k, iters, *a, **kw: (
            lambda e: e._replace(converged=e.converged | True)
        )(real(hvp, dim, k, k, *a, **kw))
    before, start = peak_mb(), time.process_time()
    try:
        if whole_surface:
            landscape, curvature = surface.surface_values(found.loss, found.params, settings, found.windows)
            reasons = {**landscape.reasons, **curvature.reasons}
        else:
            reasons = surface.curvature_values(found.loss, found.params, settings, windows=found.windows)[0].reasons
    finally:
        surface._finite, surface.top_eigenpairs = checked, real
    parameters = sum(p.numel() for p in found.params.values())
    return {
        "model": name,
        "parameters": parameters,
        "large_model_path": surface.large_model(parameters, settings),
        "what": "whole surface (Lanczos cut at k steps)" if whole_surface else "curvature",
        "peak_rss_before_mb": round(before),
        "peak_rss_mb": round(peak_mb()),
        "cpu_s": round(time.process_time() - start, 1),
        "products": len(seconds),
        "s_per_product": round(sum(seconds) / max(len(seconds), 1), 3),
        "reasons": sorted(set(reasons.values())),
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench curvature", description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=["pythia-70m-shaped"], help="a,b or a b: of SURFACE_MODELS")
    ap.add_argument("--whole-surface", action="store_true", help="both slices too, Lanczos cut short")
    ap.add_argument("--out", type=Path, help="also write the JSON summary here")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # the child process: one model, JSON on stdout
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one, args.whole_surface)))
        return 0
    results = []
    for name in model_names(args.models):
        command = [sys.executable, "-m", "bench", "curvature", "--one", name]
        child = subprocess.run(command + ["--whole-surface"] * args.whole_surface, capture_output=True, text=True)
        if child.returncode:
            raise SystemExit(f"{name}: the measuring process failed: {child.stderr.strip().splitlines()[-1:]}")
        result = json.loads(child.stdout.strip().splitlines()[-1])
        results.append(result)
        print(
            f"{name}: {result['parameters'] / 1e6:.1f}M parameters, {result['what']}: peak {result['peak_rss_mb']} MB "
            f"(model and batch {result['peak_rss_before_mb']} MB), {result['cpu_s']} s CPU, {result['products']} "
            f"products at {result['s_per_product']} s",
            file=sys.stderr,
        )
    summary = json.dumps(results, indent=1)
    print(summary)
    if args.out:
        args.out.write_text(summary + "\n")
    return 0
