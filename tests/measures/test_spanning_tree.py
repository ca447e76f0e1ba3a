"""topometrics.measures.spanning_tree: the dense maximum spanning tree against brute-force Kruskal, with ties."""

from __future__ import annotations

import numpy as np
import pytest

from tests.measures.helpers import brute_force_min_tree
from topometrics.measures.spanning_tree import dense_max_tree


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
