"""topometrics.verdict.levels: a run's cell, why a within-cell comparison cannot run, and cell-centred arrays."""

import numpy as np
import pandas as pd

from topometrics.verdict import levels


def runs(rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["rung", "variant", "seed", "n_seen"])


def test_a_cell_is_a_rung_and_a_recipe_and_runs_without_variants_are_the_base():
    frame = runs([("a", "x", 1, 5), ("a", None, 2, 5), ("b", "x", 1, 5)])
    assert levels.cells(frame).tolist() == ["a|x", "a|base", "b|x"]
    assert levels.cells(frame.drop(columns="variant")).tolist() == ["a|base", "a|base", "b|base"]


def test_the_within_level_needs_enough_checkpoints_and_two_cells_with_two_seeds():
    two_cells = runs([("a", "x", 1, 5), ("a", "x", 2, 5), ("b", "x", 1, 5), ("b", "x", 2, 4)])
    assert levels.within_problem(two_cells, 0.5) is None
    assert levels.within_problem(two_cells.assign(n_seen=3), 0.2) == (
        "fraction 0.2 observes at most 3 checkpoints per run; need 4"
    )
    one_short = two_cells.assign(n_seen=[5, 5, 5, 3])  # b's second seed has too few checkpoints: b has one seed
    assert levels.within_problem(one_short, 0.3) == "the within-cell test needs 2 cells with >= 2 seeds, got 1"
    assert levels.within_problem(two_cells.iloc[:0], 0.3).startswith("fraction 0.3 observes at most 0")


def test_within_cells_drops_one_seed_cells_centres_each_cell_and_ranks_its_seeds():
    frame = runs([("a", "x", 9, 5), ("a", "x", 3, 5), ("b", "x", 4, 5), ("b", "y", 1, 5), ("b", "y", 2, 5)])
    target = np.array([1.0, 3.0, 100.0, 10.0, 20.0])
    inputs = np.array([[1.0, 2.0], [3.0, 6.0], [0.0, 0.0], [5.0, 5.0], [7.0, 9.0]])
    sub, (y, x), groups = levels.within_cells(frame, target, inputs)
    assert sub["seed"].tolist() == [9, 3, 1, 2]  # b|x has one seed: left out
    np.testing.assert_allclose(y, [-1.0, 1.0, -5.0, 5.0])
    np.testing.assert_allclose(x, [[-1.0, -2.0], [1.0, 2.0], [-1.0, -2.0], [1.0, 2.0]])
    assert groups.tolist() == [2.0, 1.0, 1.0, 2.0]  # a run's seed rank in its cell: one fold per rank
