"""Helpers shared by the measures tests: the brute-force Kruskal oracles and trained-looking layers."""

from __future__ import annotations

import numpy as np


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


def brute_force_tree(weight: np.ndarray) -> np.ndarray:
    """Kruskal over all edges sorted by |w| descending, plain union-find (the reference)."""
    a = np.abs(np.asarray(weight, dtype=np.float64))
    n, m = a.shape
    parent = list(range(n + m))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    values = []
    for flat in np.argsort(-a.ravel(), kind="stable"):
        r, c = divmod(int(flat), m)
        ru, cu = find(r), find(n + c)
        if ru != cu:
            parent[ru] = cu
            values.append(a.ravel()[flat])
    return np.sort(values)[::-1]


def trained_like(shape, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(shape) * np.exp(rng.standard_normal((shape[0], 1)))
    return w * np.exp(0.5 * rng.standard_normal((1, shape[1])))
