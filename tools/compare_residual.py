"""With and without residual connections: the loss surface's landscape and curvature, paired by seed.

    python tools/compare_residual.py make CORPUS OUT [--rung small] [--steps 1000] [--seeds 1,2,3,4] [--radius R]
    python tools/compare_residual.py show OUT [--features ls_rand_minima,...]

``make`` builds one temporary project (``OUT/project``: the code of this checkout, tools/same_results.copy_pipeline)
whose ladder holds the rung twice, as declared (``<rung>``) and as ``<rung>_nores`` (the same shape with
``residual: false``), trained on ``data.corpus: CORPUS`` for the seeds given, with only the ``landscape`` and
``curvature`` families computed at every checkpoint (``features.landscape_every: 1``), and runs ``dvc repro``.
``show`` reads the warehouse and prints, per feature, the runs side by side (paired by seed) at the final checkpoint
and as the mean over the run's trained checkpoints (step > 0: "along training"), with the mean paired difference
(without − with), its 95 % t interval, the paired t test and the Wilcoxon signed-rank test (scipy, two-sided).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import duckdb
import numpy as np
import yaml
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.same_results import copy_pipeline, start_repro  # noqa: E402

CHECKOUT = Path(__file__).resolve().parents[1]
SMALL = {
    "train": {"ckpt_every": 100, "warmup": 100, "workers": 2, "threads": 1},
    "data": {"val_windows": 64},
    "features": {"families": ["landscape", "curvature"], "landscape_every": 1, "workers": 2},
    "analysis": {"bootstrap": 200},
}  # fmt: skip
KEYS = ("minima", "saddles", "tp", "mean_pers", "max_pers", "centre_basin", "range")
FEATURES = tuple(f"ls_{pair}_{key}" for pair in ("rand", "hess") for key in KEYS) + (
    "hess_eig1", "hess_eig2", "hess_eig3", "hess_trace", "hess_eig1_over_trace",
)  # fmt: skip

TRAJECTORY = ("ls_rand_minima", "ls_hess_saddles", "ls_hess_mean_pers", "ls_hess_centre_basin", "hess_eig1")


def project_params(
    base: dict, corpus: str, rung: str, steps: int, seeds: list[int], radius: float | None = None
) -> dict:
    """``base`` (params.yaml as loaded) with the comparison's recipe: ``rung`` and ``<rung>_nores`` only, the
    latter ``rung``'s shape with ``residual: False``; no external series; ``radius`` (if given) the slice's
    half-width ``features.landscape_radius``."""
    if rung not in base["ladder"]:
        raise SystemExit(f"error: rung {rung!r} is not in params.yaml's ladder; use one of {sorted(base['ladder'])}")
    params = {section: dict(values) if isinstance(values, dict) else values for section, values in base.items()}
    for section, values in SMALL.items():
        params[section] = dict(params[section]) | values
    shape = {k: v for k, v in (base["ladder"][rung] or {}).items() if k != "residual"}
    params["data"] |= {"corpus": corpus}
    if radius is not None:
        params["features"]["landscape_radius"] = radius
    params["train"] |= {"steps": steps, "seeds": seeds}
    params["ladder"] = {rung: shape, f"{rung}_nores": shape | {"residual": False}}
    params["variants"] = {}
    params["series"] = dict(params["series"]) | {"sources": {}}
    return params


def paired(with_res: dict[int, float], without: dict[int, float]) -> dict:
    """Paired comparison of two {seed: value} maps over their common seeds with finite values in both.

    Returns n, the mean of each side, the mean difference d = without − with, its 95 % t interval (NaN for
    n < 2), the paired t test's t and p (scipy.stats.ttest_rel) and the Wilcoxon signed-rank p (exact, two-sided;
    NaN when every difference is 0, where the test is undefined)."""
    seeds = sorted(s for s in with_res.keys() & without.keys() if np.isfinite(with_res[s]) and np.isfinite(without[s]))
    a = np.array([with_res[s] for s in seeds], dtype=float)
    b = np.array([without[s] for s in seeds], dtype=float)
    d = b - a
    n = len(d)
    mean = lambda x: float(x.mean()) if n else math.nan  # noqa: E731
    out = {"n": n, "seeds": seeds, "mean_with": mean(a), "mean_without": mean(b), "diff": mean(d)}
    out["ci_low"] = out["ci_high"] = out["t"] = out["p_t"] = out["p_wilcoxon"] = math.nan
    if n >= 2:
        sd = d.std(ddof=1)
        half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
        out["ci_low"], out["ci_high"] = out["diff"] - half, out["diff"] + half
        if sd > 0:
            res = stats.ttest_rel(b, a)
            out["t"], out["p_t"] = float(res.statistic), float(res.pvalue)
    if n >= 1 and np.any(d != 0):
        out["p_wilcoxon"] = float(stats.wilcoxon(b, a, zero_method="wilcox", alternative="two-sided").pvalue)
    return out


def read_values(con: duckdb.DuckDBPyConnection, rung: str, features: list[str]) -> dict:
    """{(rung', feature, 'final' | 'mean'): {seed: value}} for rung' in (rung, rung_nores), layer 'all'; 'mean' is
    over the checkpoints after initialisation (step > 0), where Lanczos often fails and Hutchinson's trace can be
    negative (an indefinite Hessian at random weights)."""
    rows = con.execute(
        """WITH f AS (SELECT rung, seed, step, feature, value FROM features
                      WHERE layer = 'all' AND rung IN (?, ?) AND feature IN (SELECT unnest(?)))
           SELECT f.rung, f.seed, f.feature, 'final', f.value FROM f
             JOIN final_checkpoints c USING (rung, seed, step)
           UNION ALL
           SELECT rung, seed, feature, 'mean', avg(value) FROM f WHERE step > 0 AND value IS NOT NULL GROUP BY ALL""",
        [rung, f"{rung}_nores", features],
    ).fetchall()
    out: dict = {}
    for r, seed, feature, when, value in rows:
        out.setdefault((r, feature, when), {})[seed] = math.nan if value is None else float(value)
    return out


def show(out: Path, rung: str, features: list[str]) -> None:
    with duckdb.connect(str(out / "project" / "data" / "warehouse.duckdb"), read_only=True) as con:
        final = con.execute(
            "SELECT rung, seed, step, round(val_loss, 4) FROM final_checkpoints WHERE rung IN (?, ?) ORDER BY 1, 2",
            [rung, f"{rung}_nores"],
        ).fetchall()
        nulls = con.execute(
            """SELECT rung, feature, count(*), any_value(reason) FROM features WHERE value IS NULL AND layer = 'all'
               AND rung IN (?, ?) AND feature IN (SELECT unnest(?)) GROUP BY ALL ORDER BY 1, 2""",
            [rung, f"{rung}_nores", features],
        ).fetchall()
        values = read_values(con, rung, features)
        trajectory = con.execute(
            """SELECT step, rung, feature, round(avg(value), 4), count(value) FROM features
               WHERE layer = 'all' AND rung IN (?, ?) AND feature IN (SELECT unnest(?)) GROUP BY ALL ORDER BY ALL""",
            [rung, f"{rung}_nores", list(TRAJECTORY)],
        ).fetchall()
    print("final val loss (rung, seed, step, nats/token):", *final, sep="\n  ")
    if nulls:
        print("NULL rows (rung, feature, count, a reason):", *nulls, sep="\n  ")
    print("\nalong training: the mean over seeds (and how many seeds have a value) per step")
    print(f"{'step':>5s} {'rung':12s} " + " ".join(f"{f:>22s}" for f in TRAJECTORY))
    cells = {(step, r, f): f"{v} ({n})" for step, r, f, v, n in trajectory}
    for step, r in sorted({(step, r) for step, r, *_ in trajectory}):
        print(f"{step:5d} {r:12s} " + " ".join(f"{cells.get((step, r, f), '-'):>22s}" for f in TRAJECTORY))
    for when in ("final", "mean"):
        print(f"\n== {when} ({'last checkpoint' if when == 'final' else 'mean over the checkpoints with step > 0'}); "
              "d = without - with")  # fmt: skip
        print(f"{'feature':22s} {'with (per seed)':34s} {'without (per seed)':34s} "
              f"{'mean d':>9s} {'95% t CI':>21s} {'t':>7s} {'p_t':>6s} {'p_W':>6s}")  # fmt: skip
        for feature in features:
            a = values.get((rung, feature, when), {})
            b = values.get((f"{rung}_nores", feature, when), {})
            r = paired(a, b)
            side_a, side_b = (" ".join(f"{m[s]:.4g}" for s in r["seeds"]) for m in (a, b))
            ci = f"[{r['ci_low']:9.4g},{r['ci_high']:9.4g}]"
            print(f"{feature:22s} {side_a:34s} {side_b:34s} {r['diff']:9.4g} {ci} "
                  f"{r['t']:7.3g} {r['p_t']:6.3f} {r['p_wilcoxon']:6.3f}")  # fmt: skip


def make(corpus: str, out: Path, rung: str, steps: int, seeds: list[int], radius: float | None) -> None:
    project = out / "project"
    copy_pipeline(CHECKOUT, project)
    base = yaml.safe_load((CHECKOUT / "params.yaml").read_text())
    params = project_params(base, corpus, rung, steps, seeds, radius)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    code = start_repro(project, out / "repro.log", "residual").wait()
    if code:
        sys.exit(f"error: dvc repro failed in {project}; see {out}/repro.log")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("make", "show"))
    ap.add_argument("args", nargs="+", help="make: CORPUS OUT; show: OUT")
    ap.add_argument("--rung", default="small")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--seeds", default="1,2,3,4")
    ap.add_argument("--radius", type=float, default=None, help="features.landscape_radius (default: params.yaml's)")
    ap.add_argument("--features", default=",".join(FEATURES))
    a = ap.parse_args(argv)
    if a.action == "make":
        corpus, out = a.args
        make(corpus, Path(out), a.rung, a.steps, [int(v) for v in a.seeds.split(",") if v], a.radius)
    else:
        show(Path(a.args[0]), a.rung, a.features.split(","))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
