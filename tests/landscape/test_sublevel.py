"""topometrics.landscape.sublevel: hand-worked diagrams, the connectivity choice, wells of known depth,
invariances, and agreement with a brute-force flood fill of every sublevel set."""

import numpy as np
import pytest
from scipy import ndimage

from topometrics.landscape.sublevel import descent_basins, slice_summary, sublevel_diagram


def test_a_1d_series_pairs_each_minimum_with_the_value_that_merges_it():
    diagram = sublevel_diagram(np.array([3, 1, 4, 0, 5, 2, 6]))
    assert diagram.tolist() == [[1, 4], [2, 5], [0, np.inf]]


def test_the_neighbourhood_is_axis_aligned_two_diagonal_minima_meet_at_a_saddle():
    # [[0, 5], [5, 1]]: under 4-neighbourhood 0 and 1 are two minima joined at 5; under 8 they would touch
    diagram = sublevel_diagram(np.array([[0.0, 5.0], [5.0, 1.0]]))
    assert diagram.tolist() == [[1, 5], [0, np.inf]]
    assert slice_summary(np.array([[0.0, 5.0], [5.0, 1.0]]))["saddles"] == 1


def bowl(n=15):
    a = np.linspace(-1, 1, n)
    return a[:, None] ** 2 + 2 * a[None, :] ** 2


def test_a_convex_bowl_has_one_minimum_no_finite_bar_and_the_whole_grid_in_the_centres_basin():
    summary = slice_summary(bowl())
    assert summary == {"minima": 1, "saddles": 0, "tp": 0, "mean_pers": 0, "max_pers": 0, "centre_basin": 1.0,
                       "range": pytest.approx(3.0)}  # fmt: skip


def test_wells_of_known_depth_give_one_finite_bar_per_barrier_of_that_height():
    # three wells along a ridge of height 10: depths 1, 3, 6 below their barriers (hand-worked pairs)
    row = np.array([10, 9, 10, 7, 10, 4, 10], dtype=float)
    grid = np.vstack([np.full(7, 10.0), row, np.full(7, 10.0)])
    diagram = sublevel_diagram(grid)
    assert sorted(map(tuple, diagram.tolist())) == [(4, np.inf), (7, 10), (9, 10)]
    summary = slice_summary(grid)
    assert (summary["minima"], summary["saddles"], summary["tp"], summary["max_pers"]) == (3, 2, 4.0, 3.0)


def test_a_plateau_minimum_is_one_component_and_no_bar_is_negative():
    grid = np.array([[2.0, 0.0, 0.0, 2.0], [2.0, 0.0, 0.0, 2.0], [3.0, 3.0, 3.0, 3.0]])
    diagram = sublevel_diagram(grid)
    assert diagram.tolist() == [[0, np.inf]]
    tied = np.round(np.random.default_rng(0).random((9, 9)) * 3)
    assert (np.diff(sublevel_diagram(tied), axis=1) >= 0).all()


def test_adding_a_constant_or_transposing_leaves_every_feature_unchanged():
    grid = np.random.default_rng(1).random((11, 11))
    summary = slice_summary(grid)
    assert slice_summary(grid + 123.25) == pytest.approx(summary)
    assert slice_summary(grid.T) == pytest.approx(summary)  # the centre stays the centre


def flood_fill_counts(grid):
    """Connected components of every sublevel set {f <= t}, by scipy's 4-connected labelling."""
    return {t: ndimage.label(grid <= t)[1] for t in np.unique(grid)}


@pytest.mark.parametrize("seed", range(6))
def test_bars_alive_at_every_level_equal_the_components_a_flood_fill_finds(seed):
    grid = np.round(np.random.default_rng(seed).random((7, 9)) * 20)  # ties included
    diagram = sublevel_diagram(grid)
    for t, components in flood_fill_counts(grid).items():
        alive = int(((diagram[:, 0] <= t) & (diagram[:, 1] > t)).sum())
        assert alive == components, t


def test_descent_basins_partition_the_grid_by_minimum():
    grid = np.array([[1.0, 2.0, 3.0, 2.0, 0.0]])
    assert descent_basins(grid).tolist() == [[0, 0, 0, 4, 4]]
    assert slice_summary(grid)["centre_basin"] == pytest.approx(3 / 5)


@pytest.mark.parametrize("bad", [np.array([[0.0, np.nan]]), np.array([[np.inf]]), np.zeros((0, 3))])
def test_a_non_finite_or_empty_slice_is_refused(bad):
    with pytest.raises(ValueError, match="finite values"):
        sublevel_diagram(bad)
