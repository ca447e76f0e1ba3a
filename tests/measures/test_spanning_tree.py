"""topometrics.measures.spanning_tree: the dense maximum spanning tree against brute-force Kruskal, with ties; the
tree of a random arrangement against the tree of the whole arrangement it stands for, and its law."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

import topometrics.measures.spanning_tree as T
from tests.measures.helpers import brute_force_min_tree, brute_force_tree, trained_like
from topometrics.measures.neural_persistence import bipartite_max_spanning_tree
from topometrics.measures.spanning_tree import dense_max_tree, random_arrangement_tree, random_positions


@pytest.mark.parametrize("seed", range(8))
def test_dense_max_tree_matches_brute_force_on_tied_complete_graphs(seed):
    rng = np.random.default_rng(200 + seed)
    for k in (1, 2, 3, 5, 16, 40):
        upper = np.triu(rng.integers(0, 4, (k, k)).astype(float), k=1)
        weights = upper + upper.T
        np.fill_diagonal(weights, -np.inf)
        tree = np.sort(dense_max_tree(weights.copy()))
        # max tree of w = min tree of (c - w): same edges, so compare through the min reference
        np.testing.assert_array_equal(tree, np.sort(5.0 - brute_force_min_tree(5.0 - upper - upper.T)))


def _drawn_positions(monkeypatch) -> list[np.ndarray]:
    """Records the positions random_arrangement_tree draws (the real function does the drawing)."""
    drawn, real = [], T.random_positions
    monkeypatch.setattr(T, "random_positions", lambda *a: drawn.append(real(*a)) or drawn[-1])
    return drawn


@pytest.mark.parametrize(("shape", "ties"), [((40, 30), False), ((300, 120), False), ((25, 35), True), ((1, 9), True)])
def test_the_tree_of_a_random_arrangement_is_the_tree_of_the_whole_arrangement_its_top_ranks_begin(
    monkeypatch, shape, ties
):
    w = np.round(trained_like(shape, 3)) if ties else trained_like(shape, 3)  # ties: few distinct values
    descending = np.sort(np.abs(w).ravel())[::-1]
    drawn = _drawn_positions(monkeypatch)
    tree = random_arrangement_tree(descending, *shape, np.random.default_rng(7))
    top = np.concatenate(drawn)  # rank r at top[r]; every smaller value anywhere else, in any order
    whole = np.empty(descending.size)
    rest = np.setdiff1d(np.arange(descending.size), top)
    whole[top], whole[rest] = descending[: top.size], descending[top.size :]
    assert tree.dtype == np.float64 and tree.shape == (sum(shape) - 1,)
    np.testing.assert_array_equal(tree, bipartite_max_spanning_tree(whole.reshape(shape)))
    np.testing.assert_array_equal(tree, brute_force_tree(whole.reshape(shape)))
    assert top.size < descending.size or shape == (1, 9)  # the large layers never needed every position


def test_consecutive_draws_of_positions_are_a_uniformly_random_permutation():
    # total 4: one position by rejection, then three from the shuffled rest; all 24 orders equally likely
    rng, counts = np.random.default_rng(11), {}
    for _ in range(12_000):
        used = np.zeros(4, dtype=bool)
        order = tuple(np.concatenate([random_positions(4, 1, used, rng), random_positions(4, 3, used, rng)]))
        counts[order] = counts.get(order, 0) + 1
    assert len(counts) == 24 and all(sorted(order) == [0, 1, 2, 3] for order in counts)
    assert stats.chisquare(list(counts.values())).pvalue > 1e-4
    used = np.zeros(10_000, dtype=bool)  # rejection with collisions: distinct, never a used one
    first = random_positions(10_000, 3_000, used, rng)
    second = random_positions(10_000, 3_000, used, rng)
    assert np.unique(np.concatenate([first, second])).size == 6_000 and used.sum() == 6_000
    with pytest.raises(ValueError, match="left"):
        random_positions(10, 11, np.zeros(10, dtype=bool), rng)


def test_the_random_arrangements_tree_has_the_law_of_a_shuffled_layers_tree():
    w = trained_like((12, 10), 5)
    descending = np.sort(np.abs(w).ravel())[::-1]
    drawn = [random_arrangement_tree(descending, 12, 10, np.random.default_rng([1, k])).sum() for k in range(600)]
    shuffled = [
        bipartite_max_spanning_tree(np.random.default_rng([2, k]).permutation(descending).reshape(12, 10)).sum()
        for k in range(600)
    ]
    assert stats.ks_2samp(drawn, shuffled).pvalue > 1e-3
