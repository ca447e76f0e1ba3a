"""``python -m bench power --calibrate data/warehouse.duckdb``: the power simulation fitted to a finished sweep.

From the sweep's ``incremental_errors`` (the verdict's paired out-of-fold predictions, between cells, at one
fraction and scheme) and ``runs`` tables (:func:`components`):

- the layout: rungs x recipes (the most recipes of a rung) x seeds (the most of a cell);
- the base's MAE (the ``recipe`` baseline's errors where the sweep has it, else the ``norm`` one's) and its
  residual split into a cell-level and a run-level SD (one-way random effects over rung x recipe cells:
  within-cell mean square, and the cell means' variance less its share of it);
- the seed-to-seed SD (the pooled within-cell SD of the final loss) and the weight norm's gain (the loss-curve
  MAE less the loss curve + norm MAE, from the ``weight_norm`` row).

:func:`bench.power.calibrated_model` sets the simulation's residual, its cell share, the per-run part the loss
curve sees and the norm's part (none where the norm gains nothing) from them, then corrects the residual so that
the simulated base MAE matches, and the curve's part (then the residual's cell share) so that the within-cell
SD does.
Read-only on the warehouse; it imports nothing of :mod:`bench.power`, which imports it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def components(path: str, fraction: float | None = None, cv: str | None = None, baseline: str | None = None) -> dict:
    """The variance components of the sweep in the warehouse at ``path`` (see the module docstring), nats or the
    warehouse's loss unit. ``fraction`` default: the smallest with a between-cell verdict row; ``cv`` default:
    the first of variant, seed, rung with rows; ``baseline`` (``recipe`` or ``norm``) default: ``recipe`` where
    the sweep has it (``norm`` restates an endpoint that was tested against the loss curve + norm)."""
    import duckdb  # only here: the plain power simulation (bench.power) needs no DuckDB

    with duckdb.connect(str(path), read_only=True) as con:
        errors = con.execute("SELECT * FROM incremental_errors").df()
        runs = con.execute("SELECT rung, variant, seed FROM runs WHERE kind = 'ladder'").df()
    if "level" in errors:
        errors = errors[errors["level"].fillna("between") == "between"]
    if errors.empty or runs.empty:
        raise ValueError(f"{path}: no between-cell verdict errors or no ladder runs; run the analysis first")
    fraction = float(errors["fraction"].min()) if fraction is None else fraction
    errors = errors[np.isclose(errors["fraction"], fraction)]
    cv = cv or next(c for c in ("variant", "seed", "rung") if (errors["cv"] == c).any())
    errors = errors[errors["cv"] == cv]
    if errors.empty:
        raise ValueError(f"{path}: no between-cell verdict errors at fraction {fraction:g} under cv {cv}")
    norm = errors[errors["family"] == "weight_norm"]
    recipe = errors[errors["comparison"].str.endswith("vs recipe")] if baseline != "norm" else errors.iloc[:0]
    base = recipe if len(recipe) else errors[errors["comparison"].str.endswith(("vs norm", "vs (2)"))]
    base = base[base["family"] == base["family"].iloc[0]] if len(base) else norm
    cells = base["rung"].astype(str) + "|" + base["variant"].fillna("base").astype(str)
    residual = (base["actual"] - base["predicted_without"]).to_numpy(float)
    cell_sd, run_sd = split_residual(residual, cells.to_numpy())
    sizes = runs.groupby(["rung", "variant"]).size()
    shape = (runs["rung"].nunique(), int(runs.groupby("rung")["variant"].nunique().max()), int(sizes.max()))
    return {
        "shape": shape, "cv": cv, "fraction": fraction, "baseline": "recipe" if len(recipe) else "norm",
        "base_mae": float(base["error_without"].mean()), "cell_sd": cell_sd, "run_sd": run_sd,
        "seed_sd": pooled_within_sd(base["actual"].to_numpy(float), cells.to_numpy()),
        "loss_mae": float(norm["error_without"].mean()) if len(norm) else np.nan,
        "norm_gain": float(norm["error_without"].mean() - norm["error_with"].mean()) if len(norm) else np.nan,
    }  # fmt: skip


def pooled_within_sd(values: np.ndarray, cells: np.ndarray) -> float:
    """The pooled within-cell SD (ddof: runs less cells)."""
    frame = pd.DataFrame({"v": values, "c": cells})
    dev = frame["v"] - frame.groupby("c")["v"].transform("mean")
    dof = len(frame) - frame["c"].nunique()
    return float(np.sqrt((dev**2).sum() / dof)) if dof > 0 else np.nan


def split_residual(residual: np.ndarray, cells: np.ndarray) -> tuple[float, float]:
    """(cell-level SD, run-level SD) of a residual by one-way random effects: the run-level variance is the
    within-cell mean square, the cell-level one the variance of the cell means less run variance / cell size
    (floored at 0)."""
    run_sd = pooled_within_sd(residual, cells)
    means = pd.Series(residual).groupby(cells).mean()
    size = len(residual) / len(means)
    cell_var = max(float(means.var(ddof=1)) - run_sd**2 / size, 0.0)
    return float(np.sqrt(cell_var)), run_sd
