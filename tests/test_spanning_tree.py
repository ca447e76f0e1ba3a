"""topometrics.measures.spanning_tree: the dense maximum spanning tree against brute-force Kruskal, with ties."""

from __future__ import annotations

import numpy as np
import pytest

from topometrics.measures.spanning_tree import dense_max_tree


def brute_force_min_tree(dist: np.ndarray) -> np.ndarray:
    """Kruskal over the upper triangle sorted ascending, plain union-find (the reference)."""
    n = dist.shape[0]
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    rows, cols = np.triu_indices(n, k=1)
    values = []
    for e in np.argsort(dist[rows, cols], kind="stable"):
        ru, cu = find(int(rows[e])), find(int(cols[e]))
        if ru != cu:
            parent[ru] = cu
            values.append(dist[rows[e], cols[e]])
    return np.sort(values)


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
