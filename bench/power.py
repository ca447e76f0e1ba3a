"""``python -m bench power``: false positives and power of the verdict's test on simulated sweeps.

Run sets shaped like the sweep (rungs x recipes x seeds) are drawn from a generative model calibrated to
the real runs (the loss-curve-only MAE ~0.10 nats, + weight norm ~0.055), each with a family of k
features (2k columns: level and rate). Three kinds of family:

- ``signal s``: the first column is a direction independent of the norm and the loss curve that explains
  a share s of the final loss's residual variance, at the cell level and at the run level alike;
- ``noise`` null: every column pure noise (s = 0);
- ``recipe proxy`` null: one column ~ 1 / LR (sharpness at the edge of stability) plus noise, the rest noise;
- ``nuisance`` null: every column a noisy copy of the weight norm or a loss law plus recipe-level offsets:
  a family that tracks training, as topology does, yet adds nothing.

Each run set goes through the product's own code: :func:`topometrics.verdict.inference.family_test`
(orthogonalised family, Clark-West statistic, cell-block permutation p) and
:func:`topometrics.verdict.verdict.word` (the primary endpoint's verdict: test and minimum effect).
Printed: % of run sets called ``adds`` per layout x CV scheme x family, then the whole result as one JSON line.
Options: ``--layouts 3x4x8,2x4x4`` ``--reps 100`` ``--perms 99`` ``--k 3`` ``--jobs 1`` ``--cvs seed,variant,rung``
``--out FILE`` ``--calibrate WAREHOUSE`` (the components of a finished sweep, read by :mod:`bench.power_calibrate`;
the simulation fitted to them, :func:`calibrated_model`; its power and the cells 80 % power needs) ``--need 0.8``
(also the fewest seeds per cell, rungs and recipes fixed, that reach this power at s = 0.3: the n to record as
``analysis.primary.needed_runs`` when a sweep falls short). The base here is one ridge over the three laws, the norm
and the recipe's log LR, with the verdict's monotone basis of the norm level and log LR
(:func:`topometrics.verdict.baselines.flexible_basis`; its choice among loss-curve candidates is not simulated). The
``recipe proxy`` null is a feature monotone in the LR plus noise while the loss bends with the LR; ``recipe proxy
(linear base)`` runs it with the basis left out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import pandas as pd

from bench.power_calibrate import components, pooled_within_sd
from topometrics.verdict import baselines, inference, verdict

SHARES = (0.1, 0.3, 0.5)
SEED = 20261124


@dataclass(frozen=True)
class Model:
    """Sizes of the parts of the target (final - last observed val loss), in nats."""

    rung: float = 0.08  # the rungs' effects span -rung .. +rung
    recipe: float = 0.08  # sd of a recipe's effect
    cell: float = 0.02  # sd of a rung x recipe interaction
    seen: float = 0.035  # sd of the per-run part the loss curve shows
    law_scale: tuple = (0.80, 1.00, 1.15)  # how each loss law reads the curve's part
    law_bias: float = 0.010  # sd per (law, recipe): a schedule the law misreads
    law_noise: float = 0.007  # sd of the per-run error the laws share, and of each law's own
    norm: float = 0.145  # sd of the part only the weight norm sees
    norm_shares: tuple = (0.5, 0.3, 0.2)  # of its variance: recipe, cell, run
    norm_noise: tuple = (0.08, 0.30)  # noise of the norm's level and rate (units of its latent)
    residual: float = 0.041  # sd of what neither sees, a share cell_share of its variance shared by a cell's seeds
    cell_share: float = 0.5
    lr_effect: float = 0.03  # sd of a U-shaped, asymmetric effect of the recipe's log peak LR (the base sees the LR)


@dataclass(frozen=True)
class RunSet:
    base: np.ndarray  # (n, 10): 3 loss laws' drops, norm level and rate, log LR; rank and square of norm, log LR
    extra: np.ndarray  # (n, 2k): the family's columns
    y: np.ndarray  # (n,) target, nats
    rung: np.ndarray
    recipe: np.ndarray
    seed: np.ndarray


def layout(text: str) -> tuple[int, int, int]:
    """'3x4x8' -> (rungs, recipes, seeds)."""
    rungs, recipes, seeds = (int(v) for v in text.lower().split("x"))
    return rungs, recipes, seeds


def simulate(shape: tuple[int, int, int], k: int, s: float, null: str, rng: np.random.Generator, m=Model()):
    """One run set of ``shape`` with a k-feature family: ``null`` 'signal' (share s), 'noise' or 'nuisance'."""
    n_rung, n_rec, n_seed = shape
    rung = np.repeat(np.arange(n_rung), n_rec * n_seed)
    recipe = np.tile(np.repeat(np.arange(n_rec), n_seed), n_rung)
    seed = np.tile(np.arange(n_seed), n_rung * n_rec)
    n, cell = len(rung), rung * n_rec + recipe
    n_cell = n_rung * n_rec
    rung_effect = np.linspace(-m.rung, m.rung, n_rung) if n_rung > 1 else np.zeros(1)
    seen = rung_effect[rung] + rng.normal(0, m.recipe, n_rec)[recipe] + rng.normal(0, m.cell, n_cell)[cell]
    seen = seen + rng.normal(0, m.seen, n)
    bias = rng.normal(0, m.law_bias, (3, n_rec))[:, recipe]
    shared = rng.normal(0, m.law_noise, n)
    laws = np.stack([a * seen + bias[j] + shared + rng.normal(0, m.law_noise, n) for j, a in enumerate(m.law_scale)])
    w = np.sqrt(np.asarray(m.norm_shares))
    z = w[0] * rng.normal(size=n_rec)[recipe] + w[1] * rng.normal(size=n_cell)[cell] + w[2] * rng.normal(size=n)
    norm = np.column_stack([z + rng.normal(0, m.norm_noise[0], n), 0.5 * z + rng.normal(0, m.norm_noise[1], n)])
    c, r = np.sqrt(m.cell_share), np.sqrt(1 - m.cell_share)
    planted = c * rng.normal(size=n_cell)[cell] + r * rng.normal(size=n)  # unit variance, cell_share cell-level
    other = c * rng.normal(size=n_cell)[cell] + r * rng.normal(size=n)
    share = s if null == "signal" else 0.0
    log_lr = rng.uniform(np.log(3e-4), np.log(3e-3), n_rec)[recipe]  # recipes over a 10x LR range
    u = (log_lr - np.log(1e-3)) / 0.66  # ~unit spread; the loss is U-shaped in the LR, steeper above the best
    bend = np.where(u > 0, u**2, 0.4 * np.abs(u) ** 1.5)
    y = seen + m.norm * z + m.residual * (np.sqrt(share) * planted + np.sqrt(1 - share) * other)
    y = y + m.lr_effect * (bend - bend.mean()) / (bend.std() + 1e-12)
    extra = rng.normal(size=(n, 2 * k))
    if null == "signal":
        extra[:, 0] = planted
    if null == "recipe proxy":  # sharpness ~ 2 / LR (edge of stability): monotone in the LR, plus noise
        extra[:, 0] = np.exp(-1.5 * u) * np.exp(rng.normal(0, 0.1, n))
    if null == "nuisance":
        offsets = rng.normal(size=(n_rec, 2 * k))[recipe]
        zs = (norm[:, 0] - norm[:, 0].mean()) / norm[:, 0].std()
        zl = (laws[0] - laws[0].mean()) / laws[0].std()
        extra[:, 0::2] = 0.8 * zs[:, None] + 0.6 * extra[:, 0::2] + 0.5 * offsets[:, 0::2]
        extra[:, 1::2] = 0.5 * zl[:, None] + extra[:, 1::2] + 0.5 * offsets[:, 1::2]
    extra = extra * rng.uniform(0.5, 5, 2 * k) + rng.uniform(-3, 3, 2 * k)  # arbitrary units and offsets
    known = pd.DataFrame({"weight_norm_level": norm[:, 0], "weight_norm_rate": norm[:, 1], "recipe_log_lr": log_lr})
    flexible, cols = baselines.flexible_basis(known, list(known.columns))  # the verdict's own monotone basis
    return RunSet(np.column_stack([laws.T, flexible[cols].to_numpy(float)]), extra, y, rung, recipe, seed)


def one_verdict(runs: RunSet, cv: str, n_perm: int, seed: int, margin: float, min_effect: float) -> dict:
    """The primary endpoint's verdict on one run set under leave-one-``cv``-out (the product's code)."""
    groups = {"seed": runs.seed, "variant": runs.recipe, "rung": runs.rung}[cv]
    cells = runs.rung * 1000 + runs.recipe
    labels = inference.RunLabels(groups, runs.rung, cells, runs.seed)
    test = inference.family_test(  # the primary endpoint's test, as the verdict runs it
        runs.base, runs.extra, runs.y, labels, inference.Refits(n_perm, seed, stop=10)
    )
    row = verdict.summarise(runs.y, test, cells)
    word = verdict.word(row, test.p_value, 0.05, margin, min_effect)
    return {"p": test.p_value, "word": word, "gain_share": row["gain_share"], "mae_without": row["mae_without"]}


def calibration(shape: tuple[int, int, int], reps: int = 20) -> dict:
    """Leave-one-seed-out MAE of the loss laws alone and with the weight norm (the real sweep: 0.108, 0.053)."""
    maes = []
    for rep in range(reps):
        runs = simulate(shape, 3, 0.0, "noise", np.random.default_rng([SEED, 7, rep]))
        out = inference.nested_cross_validate(runs.base[:, :3], runs.base[:, 3:5], runs.y, runs.seed)
        maes.append([np.mean(np.abs(out["without"] - runs.y)), np.mean(np.abs(out["with"] - runs.y))])
    loss, norm = np.mean(maes, axis=0)
    return {"mae_loss_curve": float(loss), "mae_with_norm": float(norm)}


LINEAR = " (linear base)"  # a null run with the base's monotone basis left out: what the basis guards against


def _task(task: tuple) -> str:
    shape, cv, k, null, s, rep, n_perm, margin, min_effect, *model = task
    rng = np.random.default_rng([SEED, *shape, k, rep, int(100 * s), len(null)])
    runs = simulate(shape, k, s, null.removesuffix(LINEAR), rng, *model)
    if null.endswith(LINEAR):  # laws, norm level and rate, log LR: each enters linearly only
        runs = RunSet(runs.base[:, :6], runs.extra, runs.y, runs.rung, runs.recipe, runs.seed)
    return one_verdict(runs, cv, n_perm, rep, margin, min_effect)["word"]


def _words(tasks: list[tuple], jobs: int) -> list[str]:
    """The verdict word of each simulated run set (:func:`_task`), on ``jobs`` spawned processes or here."""
    if jobs > 1:
        with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
            return list(pool.map(_task, tasks, chunksize=4))
    return [_task(t) for t in tasks]


NULLS = ("noise", "nuisance", "recipe proxy")


def rates(shape, cvs, k, reps, n_perm, margin=0.05, min_effect=0.01, jobs=1, progress=None, m=None, nulls=NULLS):
    """% of ``reps`` run sets called 'adds' (and 'ruled out') per CV scheme and family: the ``nulls`` (noise,
    nuisance, recipe proxy: a feature monotone in the LR plus noise; '<null> (linear base)': the same without the
    base's monotone basis), planted signal at each of :data:`SHARES`. ``m``: the :class:`Model` (default its own)."""
    kinds = [*((null, 0.0) for null in nulls), *(("signal", s) for s in SHARES)]
    cells = [(cv, null, s) for cv in cvs for null, s in kinds]
    model = () if m is None else (m,)
    tasks = [
        (shape, cv, k, null, s, rep, n_perm, margin, min_effect, *model) for cv, null, s in cells for rep in range(reps)
    ]
    words = _words(tasks, jobs)
    out = {}
    for i, (cv, null, s) in enumerate(cells):
        got = words[i * reps : (i + 1) * reps]
        name = null if null != "signal" else f"s={s:g}"
        adds = 100 * np.mean([w == "adds" for w in got])
        ruled = 100 * np.mean([w.startswith("ruled out") for w in got])
        out[f"{cv}/{name}"] = {"adds_pct": float(adds), "ruled_out_pct": float(ruled), "reps": reps}
        if progress:
            progress(f"{'x'.join(map(str, shape))} {cv:8s} {name:9s} adds {adds:5.1f}%  ruled out {ruled:5.1f}%")
    return out


def power_at(shape, cv, k, reps, n_perm, share=0.3, jobs=1, margin=0.05, min_effect=0.01, m=None) -> float:
    """% of ``reps`` run sets of ``shape`` with a planted family of ``share`` called 'adds' under ``cv``."""
    model = () if m is None else (m,)
    tasks = [(shape, cv, k, "signal", share, rep, n_perm, margin, min_effect, *model) for rep in range(reps)]
    return float(100 * np.mean([w == "adds" for w in _words(tasks, jobs)]))


def seeds_needed(shape, cv, k, target, reps, n_perm, jobs=1, most=4, progress=None) -> dict:
    """The fewest seeds per cell (rungs and recipes as in ``shape``, at most ``most`` times its seeds) at which
    the primary endpoint's power at s = 0.3 reaches ``target`` % under ``cv``, by bisection over the seed count
    (power rises with n; each probe is a fresh simulation, so the answer is as noisy as ``reps`` allows).
    Returns ``{"layout", "runs", "power"}``, or with ``"layout": None`` when even ``most`` x the seeds fall short."""
    measured: dict[int, float] = {}

    def probe(seeds: int) -> float:
        if seeds not in measured:
            measured[seeds] = power_at((shape[0], shape[1], seeds), cv, k, reps, n_perm, jobs=jobs)
            if progress:
                progress(f"{shape[0]}x{shape[1]}x{seeds} {cv:8s} s=0.3 adds {measured[seeds]:5.1f}%")
        return measured[seeds]

    low, high = shape[2], most * shape[2]
    if probe(low) >= target:
        high = low
    elif probe(high) < target:
        return {"layout": None, "runs": None, "power": measured[high], "tried_seeds": high}
    while high - low > 1:  # invariant: probe(low) < target <= probe(high)
        mid = (low + high) // 2
        low, high = (low, mid) if probe(mid) >= target else (mid, high)
    layout_text = f"{shape[0]}x{shape[1]}x{high}"
    return {"layout": layout_text, "runs": shape[0] * shape[1] * high, "power": measured[high]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench power", description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", default="3x4x8,2x4x4", help="rungs x recipes x seeds, comma-separated")
    parser.add_argument("--reps", type=int, default=100, help="run sets per cell of the table")
    parser.add_argument("--perms", type=int, default=99, help="cell-block permutations per test")
    parser.add_argument("--k", type=int, default=3, help="features in the family (2 columns each)")
    parser.add_argument("--jobs", type=int, default=1, help="processes")
    parser.add_argument("--cvs", default="seed,variant,rung", help="schemes to run (those with >= 3 groups)")
    parser.add_argument("--out", default="", help="also write the JSON to this file")
    parser.add_argument(
        "--need", type=float, default=0.0, help="also find the seeds per cell that reach this power at s = 0.3 (0.8)"
    )
    parser.add_argument("--calibrate", default="", help="a finished sweep's warehouse: simulate at its own components")
    parser.add_argument("--fraction", type=float, default=None, help="--calibrate's fraction (smallest)")
    parser.add_argument("--cv", choices=("variant", "seed", "rung"), help="--calibrate's scheme (the first present)")
    parser.add_argument("--baseline", choices=("recipe", "norm"), help="--calibrate's base (recipe where present)")
    parser.add_argument("--cells-needed", action=argparse.BooleanOptionalAction, default=True,
                        help="--calibrate: also search the cells 80 %% power needs (the longest part)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.calibrate:
        return calibrate_main(args)
    t0, result = time.perf_counter(), {"k": args.k, "reps": args.reps, "perms": args.perms, "layouts": {}}
    for text in args.layouts.split(","):
        shape = layout(text)
        groups = {"seed": shape[2], "variant": shape[1], "rung": shape[0]}
        cvs = [cv for cv in args.cvs.split(",") if groups.get(cv, 0) >= 3]
        cal = calibration(shape)
        mae = f"loss curve {cal['mae_loss_curve']:.3f}, + norm {cal['mae_with_norm']:.3f} nats"
        print(f"{text}: {np.prod(shape)} runs, {shape[0] * shape[1]} cells; leave-one-seed-out MAE {mae}", flush=True)
        table = rates(
            shape, cvs, args.k, args.reps, args.perms, jobs=args.jobs, progress=lambda x: print(x, flush=True)
        )
        result["layouts"][text] = {"runs": int(np.prod(shape)), "calibration": cal, "rates": table}
        if args.need:
            result["layouts"][text]["needs"] = needs = {
                cv: seeds_needed(shape, cv, args.k, 100 * args.need, args.reps, args.perms, args.jobs, progress=print)
                for cv in cvs
            }
            for cv, got in needs.items():
                print(f"{text} {cv}: {_needs_line(got, args.need)}", flush=True)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, sort_keys=True))
    print(f"bench power: {len(result['layouts'])} layouts, {args.reps} run sets per cell, {result['seconds']} s")
    return 0


def calibrate_main(args) -> int:
    """``--calibrate``: the sweep's components, the simulation fitted to them (simulated vs real base MAE and
    within-cell SD), the between-cell power at the sweep's layout and the cells 80 % power at s = 0.3 needs."""
    t0 = time.perf_counter()
    try:
        comp = components(args.calibrate, args.fraction, args.cv, args.baseline)
    except ValueError as err:  # a warehouse without the rows asked for: one line, not a traceback
        raise SystemExit(f"bench power --calibrate: {err}") from None
    print(f"{args.calibrate}: {'x'.join(map(str, comp['shape']))} (rungs x recipes x seeds), {comp['cv']}, "
          f"fraction {comp['fraction']:g}, baseline {comp['baseline']}", flush=True)  # fmt: skip
    model, sim = calibrated_model(comp)
    for key, name in (("base_mae", "base MAE"), ("seed_sd", "within-cell SD")):
        off = 100 * (sim[key] / comp[key] - 1)
        flag = "" if abs(off) <= 15 else "  (more than 15 % off: the simulation does not fit this sweep)"
        print(f"  {name}: real {comp[key]:.4f}, simulated {sim[key]:.4f} ({off:+.1f} %){flag}", flush=True)
    print(f"  residual: cell-level SD {comp['cell_sd']:.4f}, run-level SD {comp['run_sd']:.4f}; norm gain "
          f"{comp['norm_gain']:.4f} (loss-curve MAE {comp['loss_mae']:.4f})", flush=True)  # fmt: skip
    table = rates(comp["shape"], [comp["cv"]], 1, args.reps, args.perms, jobs=args.jobs, m=model, progress=print)
    need = cells_needed(comp, model, args.reps, args.perms) if args.cells_needed else {}
    if need:
        print(f"  80 % power at s = 0.3 needs {need['cells']} cells ({need['recipes']} recipes per rung; "
              f"{need['power']:.1f} %)" if need["cells"] else f"  80 % power not reached by "
              f"{need['tried_recipes']} recipes per rung ({need['power']:.1f} %)", flush=True)  # fmt: skip
    result = {"components": comp, "simulated": sim, "model": dataclasses.asdict(model), "rates": table, "need": need}
    result["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result, sort_keys=True, default=list))
    return 0


def simulated(shape, m: Model, cv: str, reps: int = 10) -> dict:
    """Base MAE (laws + norm + recipe basis, leave-one-``cv``-out), residual split and within-cell SD of the
    final-loss target, averaged over ``reps`` simulated noise-family sweeps of ``shape`` under ``m``."""
    maes, sds = [], []
    for rep in range(reps):
        runs = simulate(shape, 1, 0.0, "noise", np.random.default_rng([SEED, 11, rep]), m)
        groups = {"seed": runs.seed, "variant": runs.recipe, "rung": runs.rung}[cv]
        folds = inference.base_folds(runs.base, runs.y, groups)
        maes.append(np.nanmean(np.abs(folds.without - runs.y)))
        sds.append(pooled_within_sd(runs.y, runs.rung * 1000 + runs.recipe))
    return {"base_mae": float(np.mean(maes)), "seed_sd": float(np.mean(sds))}


def calibrated_model(comp: dict, rounds: int = 4, reps: int = 8) -> tuple[Model, dict]:
    """A :class:`bench.Model` whose simulated base MAE and within-cell SD match ``comp``'s, and the last
    simulation's numbers. Start: the residual's size and cell share from the sweep's residual split, the norm's
    part from its gain (none where it gains nothing). Then a few rounds of rescaling: the residual by the MAE
    ratio, and the within-cell variance by :func:`_within_fitted`."""
    total = float(np.hypot(comp["cell_sd"], comp["run_sd"]))
    share = comp["cell_sd"] ** 2 / total**2 if total > 0 else 0.5
    m = dataclasses.replace(Model(), residual=total, cell_share=share)
    if np.isfinite(comp["norm_gain"]):  # the norm's part, as the default's gain ratio
        m = dataclasses.replace(m, norm=Model().norm * max(comp["norm_gain"], 0.0) / 0.05)
    for _ in range(rounds):
        sim = simulated(comp["shape"], m, comp["cv"], reps)
        m = dataclasses.replace(m, residual=m.residual * comp["base_mae"] / sim["base_mae"])
        m = _within_fitted(m, comp["seed_sd"] ** 2 - sim["seed_sd"] ** 2)
    return m, simulated(comp["shape"], m, comp["cv"], reps)


def _within_fitted(m: Model, change: float) -> Model:
    """``m`` with the target's within-cell variance moved by ``change`` (nats^2): through the per-run part the
    loss curve sees, and where that would fall below zero, the rest through the residual's run-level part (its
    cell share raised, its size kept). Why the second: under leave-one-seed-out against the loss curve + norm the
    base's residual varies more within a cell than the target does (its predictions are noisy), so a residual
    split read from it leaves more run-level variance than the target has."""
    seen_var = m.seen**2 + change
    if seen_var >= 0:
        return dataclasses.replace(m, seen=float(np.sqrt(seen_var)))
    run_var = max(m.residual**2 * (1 - m.cell_share) + seen_var, 0.0)
    share = 1 - run_var / m.residual**2 if m.residual > 0 else m.cell_share
    return dataclasses.replace(m, seen=0.0, cell_share=float(min(max(share, 0.0), 1.0)))


def cells_needed(comp: dict, m: Model, reps: int, n_perm: int, target: float = 80.0, most: int = 64) -> dict:
    """The fewest recipes per rung (rungs and seeds as the sweep's) at which the between-cell power at s = 0.3
    reaches ``target`` %, by bisection (each probe a fresh simulation); cells = rungs x recipes."""
    rungs, recipes, seeds = comp["shape"]
    probe = lambda r: power_at((rungs, r, seeds), comp["cv"], 1, reps, n_perm, m=m)  # noqa: E731
    low, high = recipes, most
    got = {low: probe(low)}
    if got[low] >= target:
        return {"cells": rungs * low, "recipes": low, "power": got[low]}
    got[high] = probe(high)
    if got[high] < target:
        return {"cells": None, "recipes": None, "power": got[high], "tried_recipes": high}
    while high - low > 1:
        mid = (low + high) // 2
        got[mid] = probe(mid)
        low, high = (low, mid) if got[mid] >= target else (mid, high)
    return {"cells": rungs * high, "recipes": high, "power": got[high]}


def _needs_line(got: dict, target: float) -> str:
    if got["layout"] is None:
        return f"{100 * target:.0f} % power not reached by {got['tried_seeds']} seeds per cell ({got['power']:.1f} %)"
    return f"{100 * target:.0f} % power at s = 0.3 needs {got['runs']} runs ({got['layout']}: {got['power']:.1f} %)"
