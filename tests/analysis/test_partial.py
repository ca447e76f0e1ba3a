"""topometrics.analysis.partial: each run's partial Spearman rho of a feature with the loss, given each control."""

import numpy as np
import pandas as pd

from topometrics.analysis import stats
from topometrics.analysis.partial import COLUMNS, CONTROLS, partial_spearman_tests


def run_frame(rung: str, seed: int, n: int = 30) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    step = np.arange(n) * 10
    w_fro = 1 + 0.1 * step + rng.normal(0, 0.5, n)
    val_loss = 5 - 0.05 * step + rng.normal(0, 0.5, n)
    values = {"vr_tp0": rng.normal(0, 0.1, n) - val_loss, "w_fro": w_fro}
    rows = [pd.DataFrame({"feature": f, "value": v}) for f, v in values.items()]
    return pd.concat(rows).assign(rung=rung, seed=seed, layer="all", step=np.tile(step, 2), w_fro=np.tile(w_fro, 2),
                                  val_loss=np.tile(val_loss, 2))  # fmt: skip


def test_each_run_feature_and_control_is_a_row_equal_to_the_statistic_and_the_control_has_none_given_itself():
    frame = pd.concat([run_frame("a", 1), run_frame("b", 2)], ignore_index=True)
    out = partial_spearman_tests(frame, n_boot=50, seed=0)
    assert list(out.columns) == [*COLUMNS, "reason"] and set(out["kind"]) == {"partial_spearman"}
    # vr_tp0 given each control, w_fro given the step only, in both runs
    assert sorted(zip(out["rung"], out["feature"], out["other"], strict=True)) == sorted(
        [(r, "vr_tp0", c) for r in ("a", "b") for c in CONTROLS] + [("a", "w_fro", "step"), ("b", "w_fro", "step")]
    )
    g = frame[(frame["rung"] == "a") & (frame["feature"] == "vr_tp0")]
    expected = stats.partial_spearman(g["value"], g["val_loss"], g["step"], 50, 0)
    row = out[(out["rung"] == "a") & (out["feature"] == "vr_tp0") & (out["other"] == "step")].iloc[0]
    assert (row["estimate"], row["ci_low"], row["ci_high"], row["n"]) == (
        expected.rho,
        expected.ci_low,
        expected.ci_high,
        expected.n,
    )
    assert row["estimate"] < -0.8  # the feature tracks the loss beyond the step


def test_no_rows_give_an_empty_table_with_the_columns():
    empty = run_frame("a", 1).iloc[:0]
    assert list(partial_spearman_tests(empty).columns) == [*COLUMNS, "reason"]
    assert partial_spearman_tests(empty).empty
