"""``bench power --calibrate``: the variance components of a finished sweep, read back from a warehouse whose
components are known."""

import duckdb
import numpy as np
import pandas as pd
import pytest

from bench import power, power_calibrate
from topometrics.verdict import baselines


def synthetic_warehouse(path, cell_sd=0.03, run_sd=0.01, shape=(3, 16, 2), seed=0) -> None:
    """Tables ``runs`` and ``incremental_errors`` of a sweep whose base residual has the given cell- and
    run-level SDs, and whose norm lowers the loss-curve MAE by a known amount."""
    rng = np.random.default_rng(seed)
    rungs, recipes, seeds = shape
    runs = pd.DataFrame(
        [(f"r{a}", f"v{b:02d}", s) for a in range(rungs) for b in range(recipes) for s in range(seeds)],
        columns=["rung", "variant", "seed"],
    ).assign(kind="ladder")
    cell = rng.normal(0, cell_sd, rungs * recipes).repeat(seeds)
    residual = cell + rng.normal(0, run_sd, len(runs))
    actual = 3.0 + rng.normal(0, 0.2, rungs * recipes).repeat(seeds) + rng.normal(0, 0.02, len(runs))
    rows = []
    for family, comparison, scale in (("weight_norm", "(2) vs (1)", 3.0), ("weights_vr", "(3) vs recipe", 1.0)):
        without = actual - scale * residual
        with_ = actual - residual  # the norm row's larger model is the recipe base's accuracy
        rows.append(runs.assign(cv="variant", level="between", fraction=0.2, family=family, comparison=comparison)
                    .assign(actual=actual, predicted_without=without, predicted_with=with_,
                            error_without=np.abs(actual - without), error_with=np.abs(actual - with_)))  # fmt: skip
    errors = pd.concat(rows, ignore_index=True)
    within = errors.assign(level="within", actual=0.0)  # within-cell rows must not enter the between components
    with duckdb.connect(str(path)) as con:
        con.register("r", runs)
        con.register("e", pd.concat([errors, within], ignore_index=True))
        con.execute("CREATE TABLE runs AS SELECT * FROM r")
        con.execute("CREATE TABLE incremental_errors AS SELECT * FROM e")


def test_calibration_recovers_the_known_components_of_a_synthetic_sweep(tmp_path):
    path = tmp_path / "warehouse.duckdb"
    synthetic_warehouse(path, cell_sd=0.03, run_sd=0.01, shape=(3, 40, 3))
    comp = power_calibrate.components(str(path))
    assert comp["shape"] == (3, 40, 3) and comp["cv"] == "variant" and comp["baseline"] == "recipe"
    assert comp["cell_sd"] == pytest.approx(0.03, rel=0.15)
    assert comp["run_sd"] == pytest.approx(0.01, rel=0.15)
    assert comp["seed_sd"] == pytest.approx(0.02, rel=0.15)
    # the recipe base's MAE is E|residual| = sqrt(2 / pi) * sqrt(cell^2 + run^2); the loss curve's is 3 times it
    assert comp["base_mae"] == pytest.approx(np.sqrt(2 / np.pi) * np.hypot(0.03, 0.01), rel=0.1)
    assert comp["norm_gain"] == pytest.approx(2 * comp["base_mae"], rel=1e-9)


def test_the_residual_split_matches_a_one_way_anova_by_hand():
    cells = np.array(["a", "a", "b", "b", "c", "c"])
    residual = np.array([1.0, 3.0, 2.0, 2.0, 6.0, 4.0])
    # within: deviations (-1, 1, 0, 0, 1, -1): SS 4 on 3 dof; cell means 2, 2, 5: variance 3, less (4/3) / 2
    cell_sd, run_sd = power_calibrate.split_residual(residual, cells)
    assert run_sd == pytest.approx(np.sqrt(4 / 3))
    assert cell_sd == pytest.approx(np.sqrt(3 - (4 / 3) / 2))


def test_the_simulated_base_sees_the_recipe_through_the_verdicts_monotone_basis():
    runs = power.simulate((2, 4, 2), 1, 0.0, "recipe proxy", np.random.default_rng(0))
    log_lr = runs.base[:, 5]
    assert runs.base.shape == (16, 10) and len(np.unique(log_lr)) == 4  # one LR per recipe
    # the proxy is monotone (decreasing) in the LR, as sharpness ~ 2 / LR
    order = np.argsort(log_lr)
    assert np.corrcoef(log_lr[order], np.log(runs.extra[order, 0]))[0, 1] < -0.9
    frame, cols = baselines.flexible_basis(pd.DataFrame({"recipe_log_lr": log_lr}), ["recipe_log_lr"])
    assert cols == ["recipe_log_lr", "recipe_log_lr~rank", "recipe_log_lr~sq"]
    assert np.allclose(frame[cols].to_numpy(), runs.base[:, [5, 8, 9]])


def test_calibration_reads_the_scheme_and_baseline_asked_for(tmp_path):
    path = tmp_path / "warehouse.duckdb"
    synthetic_warehouse(path, cell_sd=0.03, run_sd=0.01, shape=(3, 40, 3))
    with duckdb.connect(str(path)) as con:  # the same errors under leave-one-seed-out, the residual doubled
        con.execute("INSERT INTO incremental_errors SELECT * REPLACE ('seed' AS cv, actual + (actual - "
                    "predicted_without) AS actual) FROM incremental_errors WHERE cv = 'variant'")  # fmt: skip
    by_variant = power_calibrate.components(str(path))
    by_seed = power_calibrate.components(str(path), cv="seed")
    assert by_variant["cv"] == "variant" and by_seed["cv"] == "seed"
    assert by_seed["cell_sd"] == pytest.approx(2 * by_variant["cell_sd"], rel=1e-6)
    against_norm = power_calibrate.components(str(path), baseline="norm")
    assert against_norm["baseline"] == "norm" and against_norm["base_mae"] == pytest.approx(3 * by_variant["base_mae"])
    with pytest.raises(SystemExit, match="no between-cell verdict errors at fraction 0.2 under cv rung"):
        power.main(["--calibrate", str(path), "--cv", "rung", "--reps", "1"])


@pytest.mark.parametrize(
    "comp",
    [  # the retrained character sweep's components: the first row's question, and the many-recipes question
        {"shape": (3, 4, 8), "cv": "seed", "base_mae": 0.0549, "seed_sd": 0.0237, "cell_sd": 0.0626,
         "run_sd": 0.0398, "norm_gain": -1.4e-7},
        {"shape": (3, 4, 8), "cv": "variant", "base_mae": 0.1049, "seed_sd": 0.0237, "cell_sd": 0.1144,
         "run_sd": 0.0354, "norm_gain": 0.0046},
        # the BPE confirmation sweep retrained, its own question: the norm's run-level part alone is near the
        # whole within-cell SD, so the residual's must go to (almost) nothing
        {"shape": (3, 4, 8), "cv": "seed", "base_mae": 0.0360, "seed_sd": 0.0067, "cell_sd": 0.0310,
         "run_sd": 0.0357, "norm_gain": 0.0043},
    ],
)  # fmt: skip
def test_the_calibrated_simulation_fits_the_base_mae_and_within_cell_sd_within_15_percent(comp):
    # the first: the base's residual varies more within a cell (0.0398) than the target does (0.0237), and the
    # norm gains nothing; a simulation that kept its default norm part and the residual's run share was +240 % off
    model, sim = power.calibrated_model(comp)
    assert sim["base_mae"] == pytest.approx(comp["base_mae"], rel=0.15)
    assert sim["seed_sd"] == pytest.approx(comp["seed_sd"], rel=0.15)
    assert 0 <= model.cell_share <= 1 and model.seen >= 0
    assert (model.norm == 0) == (comp["norm_gain"] <= 0)


def test_the_within_cell_fit_moves_the_curves_part_first_then_the_residuals_run_share():
    m = power.Model(seen=0.03, residual=0.1, cell_share=0.5)
    grown = power._within_fitted(m, 0.0007)  # seen^2 0.0009 + 0.0007
    assert grown.seen == pytest.approx(0.04) and grown.cell_share == 0.5
    shrunk = power._within_fitted(m, -0.0009 - 0.001)  # seen to 0, then 0.001 of the residual's run part 0.005
    assert shrunk.seen == 0 and shrunk.residual == 0.1
    assert shrunk.residual**2 * (1 - shrunk.cell_share) == pytest.approx(0.004)
