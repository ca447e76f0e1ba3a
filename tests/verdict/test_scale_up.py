"""topometrics.verdict.scale_up and the scale_up_decisions view: a hand-worked rung, a sweep whose predictor
knows the answer against one that knows nothing, a rung with one recipe."""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import pytest

from topometrics.analysis import warehouse
from topometrics.verdict import scale_up


def test_a_rung_decision_by_hand():
    runs = pd.DataFrame(
        {
            "variant": ["a", "a", "b", "b", "c", "c"],
            "predicted": [2.0, 2.2, 2.05, 2.05, 3.0, np.nan],  # means a 2.1, b 2.05, c 3.0 (one finite run)
            "actual": [1.9, 2.1, 2.2, 2.4, 2.6, 1.0],  # means a 2.0, b 2.3, c 2.6 (its NaN-predicted run left out)
        }
    )
    got = scale_up.rung_decision(runs, smaller_best=2.5)
    assert got["chosen"] == "b" and got["winner"] == "a" and got["hit"] == 0.0
    assert got["regret"] == pytest.approx(0.3)  # 2.3 - 2.0
    assert got["n_recipes"] == 3 and got["n_runs"] == 5
    assert got["gain_predicted"] == pytest.approx(2.5 - 2.05) and got["gain_actual"] == pytest.approx(0.5)
    assert got["status"] == "ok"


def test_one_recipe_cannot_be_a_choice():
    runs = pd.DataFrame({"variant": ["a", "a"], "predicted": [2.0, 2.1], "actual": [2.0, 2.0]})
    got = scale_up.rung_decision(runs, np.nan)
    assert got["status"] == "skipped" and got["reason"] == "1 recipe with a prediction at this rung; a choice needs 2"


def _predictions(seed: int) -> pd.DataFrame:
    """Three rungs x 6 recipes x 2 seeds; larger rungs end lower. 'oracle' predicts the final loss with a
    small error, 'blind' predicts the rung's mean (ties broken by noise)."""
    rng = np.random.default_rng(seed)
    rows = []
    for rung, level in (("tiny", 4.0), ("small", 3.5), ("medium", 3.0)):
        recipe_effect = rng.normal(0, 0.2, 6)
        for r in range(6):
            for s in (1, 2):
                actual = level + recipe_effect[r] + rng.normal(0, 0.01)
                for name, predicted in (
                    ("oracle", actual + rng.normal(0, 0.005)),
                    ("blind", level + rng.normal(0, 0.2)),
                ):
                    rows.append({"cv": "rung", "level": "between", "fraction": 0.2, "predictor": name,
                                 "kind": "family" if name == "oracle" else "baseline", "rung": rung,
                                 "variant": f"r{r}", "seed": s, "actual": actual, "predicted": predicted})  # fmt: skip
    seed_cv = [dict(row, cv="seed") for row in rows]  # other schemes are not scale-up decisions
    return pd.DataFrame(rows + seed_cv)


def test_a_predictor_that_knows_the_final_loss_chooses_the_best_recipe_at_every_rung():
    table = scale_up.scale_up_table(_predictions(0), {"tiny": 6e3, "small": 1.2e4, "medium": 3e4})
    assert len(table) == 2 * 3  # predictors x held-out rungs; the seed scheme's rows are not read
    oracle = table[table["predictor"] == "oracle"].set_index("rung")
    assert (oracle["hit"] == 1).all() and (oracle["regret"] == 0).all()
    assert oracle.loc["small", "smaller"] == "tiny" and pd.isna(oracle.loc["tiny", "smaller"])
    assert oracle.loc["medium", "gain_actual"] == pytest.approx(
        oracle.loc["small", "actual_winner"] - oracle.loc["medium", "actual_winner"]
    )
    assert oracle.loc["medium", "gain_actual"] > 0.2  # the larger rung ends about 0.5 lower
    blind = [scale_up.scale_up_table(_predictions(s), {"tiny": 1, "small": 2, "medium": 3}) for s in range(20)]
    blind = pd.concat(blind).query("predictor == 'blind'")
    # a predictor blind to the recipe picks the best of 6 by chance: about 1 in 6
    assert 0.05 < blind["hit"].mean() < 0.35 and (blind["regret"] >= 0).all() and blind["regret"].mean() > 0.05


def test_the_scale_up_decisions_view_sums_each_predictor():
    con = duckdb.connect()
    schema, *views = warehouse.sql_files()
    con.execute(schema.read_text())
    table = scale_up.scale_up_table(_predictions(1), {"tiny": 6e3, "small": 1.2e4, "medium": 3e4})
    con.register("frame", table)
    con.execute("INSERT INTO scale_up SELECT * FROM frame")
    for view in views:
        con.execute(view.read_text())
    back = con.execute("SELECT * FROM scale_up_decisions ORDER BY predictor").df().set_index("predictor")
    assert back.loc["oracle", "decisions"] == 3 and back.loc["oracle", "hits"] == 3
    assert back.loc["blind", "mean_regret"] == pytest.approx(table.query("predictor == 'blind'")["regret"].mean())
    assert back.loc["oracle", "choices"].startswith("medium: r") and "(best)" in back.loc["oracle", "choices"]
