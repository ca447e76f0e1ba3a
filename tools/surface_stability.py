"""How much do the loss-surface features move with their budget? Cheaper settings against full ones, real checkpoints.

    python tools/surface_stability.py --runs DIR [DIR ...] --corpus CORPUS [--picks 0 0.1 0.5 1] [--out FILE]
    python tools/surface_stability.py --tables FILE [FILE ...]    # the table again from --out files

For every run folder given (``DIR/step_*.safetensors`` with sidecars) the checkpoints at the fractions
``--picks`` of its list (0: the first, 1: the last) are loaded, and on the fixed loss-surface batch (the first
``features.landscape_batch`` windows of ``CORPUS``'s validation tokens, as the features stage takes it) the
product's own functions compute, at the default radius and seed:

- curvature, **reference**: central differences, all 20 Lanczos steps, 8 probes
  (``surface.curvature_values(..., one_sided=False, stop_early=False)``), against: one-sided differences
  (all steps; and stopping early, what the features stage runs), 10 / 12 / 15 steps, and the Hutchinson trace
  at 4 / 8 probes against 32 (the same seed: the first probes are shared);
- landscape: both slices (``surface.slice_values``) at ``landscape_grid`` 15 (reference), 13, 11, 9, the
  ``hess`` slice along the reference's eigenvectors (and at 15 along the early-stopped run's, to show what
  the directions' own change does).

Prints one markdown table: per feature and setting, the median and largest relative difference
``|x - ref| / |ref|`` over the checkpoints (0 when both are 0), the share of checkpoints where the value is
equal, and Spearman's rank correlation with the reference across checkpoints (scipy); ``--out`` also writes
every value as JSON. CPU, one torch thread; progress per checkpoint on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

from topometrics.features.forward import loss_surface, validation_batch
from topometrics.landscape.curvature import hutchinson_trace, top_eigenpairs
from topometrics.landscape.slice import difference_hvp, random_direction
from topometrics.landscape.surface import LANCZOS_TOL, SurfaceSettings, curvature_values, slice_values
from topometrics.models.checkpoints import list_checkpoints, load_model
from topometrics.models.tokens import load_tokens
from topometrics.params import FeaturesParams, load_params

CHECKOUT = Path(__file__).resolve().parents[1]
GRIDS = (15, 13, 11, 9)
ITERS = (10, 12, 15)
PROBES = (4, 8, 32)


def checkpoint_values(model: torch.nn.Module, tokens: np.ndarray, params: FeaturesParams) -> dict[str, dict]:
    """``{setting: {feature: value}}`` for one checkpoint; the settings are the module docstring's."""
    surface = loss_surface(model, validation_batch(tokens, model.cfg.context, params.landscape_batch))
    loss, theta = surface.loss, surface.params
    base = SurfaceSettings(15, params.landscape_radius, params.hessian_top, 8, 20, params.seed)
    out: dict[str, dict] = {}
    ref, ref_dirs = curvature_values(loss, theta, base, one_sided=False, stop_early=False)
    out["curvature ref"] = ref.values
    out["curvature one-sided"] = curvature_values(loss, theta, base, True, False)[0].values
    early, early_dirs = curvature_values(loss, theta, base, True, True)
    out["curvature one-sided, early stop"] = early.values
    out["lanczos steps (early stop)"] = {"steps": _steps(loss, theta, base)}
    for iters in ITERS:
        values = curvature_values(loss, theta, base._replace(iters=iters), True, False)[0]
        out[f"curvature {iters} steps"] = values.values | {"unconverged": len(values.reasons)}
    hvp, dim = difference_hvp(loss, theta, one_sided=True)
    out["trace"] = {f"probes {p}": hutchinson_trace(hvp, dim, p, params.seed).trace for p in PROBES}
    gen = torch.Generator().manual_seed(params.seed)
    rand = (random_direction(theta, gen), random_direction(theta, gen))
    for grid in GRIDS:
        settings = base._replace(grid=grid)
        out[f"rand grid {grid}"] = slice_values(loss, theta, rand, settings)[0]
        if not isinstance(ref_dirs, str):
            out[f"hess grid {grid}"] = slice_values(loss, theta, ref_dirs, settings)[0]
    if not isinstance(early_dirs, str):
        out["hess grid 15, early-stop directions"] = slice_values(loss, theta, early_dirs, base)[0]
    return out


def _steps(loss, theta, settings: SurfaceSettings) -> int:
    """Lanczos steps the early-stopping run takes (its product count; the run is repeated to read it)."""
    hvp, dim = difference_hvp(loss, theta, one_sided=True)
    k = max(settings.top, 2)
    return top_eigenpairs(hvp, dim, k, settings.iters, settings.seed, LANCZOS_TOL, stop_early=True).products


def comparisons(found: list[dict]) -> list[tuple[str, str, str, dict]]:
    """``(feature, setting, reference setting, statistics)`` rows over the checkpoints ``found``."""
    pairs = [("curvature ref", s) for s in found[0] if s.startswith("curvature ") and s != "curvature ref"]
    pairs += [(f"{d} grid 15", f"{d} grid {g}") for d in ("rand", "hess") for g in GRIDS[1:]]
    pairs += [("hess grid 15", "hess grid 15, early-stop directions")]
    rows = []
    for ref, setting in pairs:
        both = [f for f in found if ref in f and setting in f]  # hess: where the reference run converged
        if not both:
            continue
        for key in both[0][ref]:
            a = np.array([f[ref][key] for f in both], dtype=float)
            b = np.array([f[setting].get(key, np.nan) for f in both], dtype=float)
            rows.append((key, setting, ref, statistics(a, b)))
    trace = np.array([f["trace"]["probes 32"] for f in found])
    for probes in PROBES[:-1]:
        rows.append(
            (
                "trace",
                f"{probes} probes",
                "32 probes",
                statistics(trace, [f["trace"][f"probes {probes}"] for f in found]),
            )
        )
    return rows


def statistics(ref, other) -> dict:
    """Median / largest relative difference, share equal and Spearman's rho of ``other`` against ``ref``."""
    ref, other = np.asarray(ref, dtype=float), np.asarray(other, dtype=float)
    ok = np.isfinite(ref) & np.isfinite(other)
    a, b = ref[ok], other[ok]
    diff = np.abs(a - b)
    rel = np.where(diff == 0, 0.0, diff / np.where(a == 0, np.nan, np.abs(a)))
    rho = spearmanr(a, b).statistic if ok.sum() > 2 and np.ptp(a) > 0 and np.ptp(b) > 0 else np.nan
    return {
        "n": int(ok.sum()),
        "median_rel": float(np.nanmedian(rel)) if rel.size else np.nan,
        "max_rel": float(np.nanmax(rel)) if rel.size and not np.isnan(rel).all() else np.nan,
        "equal": float(np.mean(diff == 0)) if diff.size else np.nan,
        "spearman": float(rho),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python tools/surface_stability.py")
    parser.add_argument("--runs", type=Path, nargs="+", default=[], help="run folders")
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus"), help="the prepared corpus")
    parser.add_argument("--picks", type=float, nargs="+", default=[0.0, 0.1, 0.5, 1.0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--tables", type=Path, nargs="+", help="tabulate these --out files instead of computing")
    args = parser.parse_args(argv)
    if args.tables:
        found = [v for path in args.tables for v in json.loads(path.read_text())["values"]]
        return report(found)
    torch.set_num_threads(1)
    params = load_params(CHECKOUT / "params.yaml").features  # the repository's
    tokens = load_tokens(args.corpus, "val")
    found, names = [], []
    for run in args.runs:
        ckpts = list_checkpoints(run)
        for index in sorted({round(p * (len(ckpts) - 1)) for p in args.picks}):
            start = time.process_time()
            model = load_model(ckpts[index])
            found.append(checkpoint_values(model, tokens, params))
            names.append(f"{run.name}@{ckpts[index].step}")
            print(f"{names[-1]}: {time.process_time() - start:.1f} s CPU", file=sys.stderr, flush=True)
    if args.out:
        args.out.write_text(json.dumps({"checkpoints": names, "values": found}, default=float, indent=1))
    return report(found)


def report(found: list[dict]) -> int:
    """Print the comparison table of the checkpoints' values ``found``."""
    rows = comparisons(found)
    print("| feature | setting | against | n | median rel. diff | max rel. diff | equal | Spearman |")
    print("|---|---|---|---|---|---|---|---|")
    for key, setting, ref, s in rows:
        print(
            f"| {key} | {setting} | {ref} | {s['n']} | {s['median_rel']:.2g} | {s['max_rel']:.2g} | "
            f"{s['equal']:.2f} | {s['spearman']:.3f} |"
        )
    steps = [f["lanczos steps (early stop)"]["steps"] for f in found]
    print(f"early-stopping Lanczos steps: median {np.median(steps):g}, range {min(steps)}-{max(steps)} of 20")
    print(f"{len(found)} checkpoints, {len(rows)} comparisons")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
