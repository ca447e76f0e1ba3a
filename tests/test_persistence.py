"""Tests of topometrics.persistence: brute force, hand-worked cases, known shapes, persim."""

from __future__ import annotations

import warnings

import numpy as np
import persim
import pytest
from scipy.sparse.csgraph import minimum_spanning_tree
from scipy.spatial.distance import pdist, squareform

from topometrics import persistence as P
from topometrics.persistence import (
    betti_curve,
    bipartite_max_spanning_tree,
    bottleneck_distance,
    diagram_summary,
    neural_persistence,
    persistence_entropy,
    representation_topology,
    shuffled_neural_persistence,
    subsample_rows,
    vietoris_rips_diagrams,
    wasserstein_distance,
)


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
    w *= np.exp(0.5 * rng.standard_normal((1, shape[1])))
    w[rng.random(shape[0]) < 0.1] = 0
    w[:, rng.random(shape[1]) < 0.05] = 0
    return w.astype(np.float32)


# --- neural persistence: exactness ---------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (7, 1), (3, 5), (40, 25), (120, 90)])
def test_tree_matches_brute_force_on_gaussian_layers(shape):
    w = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(bipartite_max_spanning_tree(w), brute_force_tree(w))


def test_tree_matches_brute_force_with_ties_and_zero_rows_and_columns():
    rng = np.random.default_rng(3)
    w = np.round(rng.standard_normal((60, 45)) * 2) / 2  # few distinct values: many ties
    w[[0, 7, 8]] = 0.0
    w[:, [0, 3]] = 0.0
    np.testing.assert_array_equal(bipartite_max_spanning_tree(w), brute_force_tree(w))


def test_tree_all_equal_and_all_zero_layers():
    # Every tie: 2x2 all-equal is the case where naive Boruvka closes a 4-cycle.
    np.testing.assert_array_equal(bipartite_max_spanning_tree(np.ones((2, 2))), [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(bipartite_max_spanning_tree(np.zeros((4, 3))), np.zeros(6))


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.random.default_rng(0).standard_normal((300, 700)).astype(np.float32),
        lambda: trained_like((300, 700), 1),
        lambda: trained_like((700, 300), 2),
        lambda: np.round(np.random.default_rng(4).standard_normal((256, 512)) * 3).astype(np.float32),
    ],
)
def test_banded_path_matches_brute_force_on_large_layers(make):
    w = make()
    assert w.size > P._SMALL_LAYER_EDGES  # exercises band, forced edges and contraction
    np.testing.assert_array_equal(bipartite_max_spanning_tree(w), brute_force_tree(w))


def test_banded_path_contraction_on_block_structure(monkeypatch):
    # Two strong blocks joined only by weak edges: the band cannot span, contraction must finish.
    rng = np.random.default_rng(5)
    w = rng.uniform(0.0, 0.01, (200, 300))
    w[:100, :150] += 1 + rng.random((100, 150))
    w[100:, 150:] += 1 + rng.random((100, 150))
    np.testing.assert_array_equal(bipartite_max_spanning_tree(w), brute_force_tree(w))
    monkeypatch.setattr(P, "_FEW_GROUPS", 0)  # the many-components contraction branch
    monkeypatch.setattr(P, "_FEW_LOW_VERTICES", 0)  # and the blocked low-vertex pass
    np.testing.assert_array_equal(bipartite_max_spanning_tree(w), brute_force_tree(w))


def test_non_finite_layer_is_rejected():
    w = np.ones((300, 300))
    w[5, 5] = np.nan
    with pytest.raises(ValueError, match="NaN/Inf"):
        bipartite_max_spanning_tree(w)
    with pytest.raises(ValueError, match="NaN/Inf"):
        bipartite_max_spanning_tree(w[:3, :3] * np.inf)


# --- neural persistence: hand-worked values and normalisations -----------------------------


def test_two_by_two_by_hand():
    # |w| = [[4, 1], [2, 3]], global max 4: tree edges 4, 3, 2 -> a = 1, .75, .5.
    w = np.array([[4.0, -1.0], [2.0, -3.0]])
    result = neural_persistence(w, 4.0)
    pers = np.array([0.0, 0.25, 0.5])
    assert result.np_sum == pytest.approx(pers.sum() / 3)
    assert result.np_norm == pytest.approx(np.sqrt((pers**2).sum() + 1) / np.sqrt(3))


def test_two_by_three_by_hand_with_a_zero_edge_and_a_larger_global_max():
    # Row 1 is dead: its tree edge has a = 0, persistence 1. Row 0's edges 3, 2, 1 all enter.
    w = np.array([[3.0, 2.0, -1.0], [0.0, 0.0, 0.0]])
    result = neural_persistence(w, 6.0)
    pers = 1 - np.array([0.5, 2 / 6, 1 / 6, 0.0])
    assert result.np_sum == pytest.approx(pers.sum() / 4)
    assert result.np_norm == pytest.approx(np.sqrt(((pers**2).sum() + 1) / 4))


def test_all_zero_network_has_persistence_one_everywhere():
    result = neural_persistence(np.zeros((3, 2)), 0.0)
    assert result.np_sum == 1.0
    assert result.np_norm == pytest.approx(np.sqrt(5 / 4))


def test_np_is_invariant_to_global_scaling_and_sign():
    w = np.random.default_rng(6).standard_normal((20, 30))
    assert neural_persistence(w, np.abs(w).max()) == pytest.approx(neural_persistence(-7.5 * w, 7.5 * np.abs(w).max()))


def test_shuffled_null_is_deterministic_for_a_seed_and_keeps_the_entries():
    w = np.random.default_rng(7).standard_normal((30, 40))
    gmax = np.abs(w).max()
    assert shuffled_neural_persistence(w, gmax, [0, 1]) == shuffled_neural_persistence(w, gmax, [0, 1])
    assert shuffled_neural_persistence(w, gmax, [0, 1]) != shuffled_neural_persistence(w, gmax, [0, 2])
    rows = np.repeat(np.arange(1, 31, dtype=float)[:, None], 40, axis=1)  # structured: rows constant
    assert shuffled_neural_persistence(rows, 30.0, 0) != neural_persistence(rows, 30.0)


# --- Vietoris-Rips --------------------------------------------------------------------------


def test_tp0_equals_minimum_spanning_tree_total_and_ripser_h0():
    from ripser import ripser

    x = np.random.default_rng(8).standard_normal((60, 5))
    h0, _ = vietoris_rips_diagrams(x)
    assert np.isinf(h0[:, 1]).sum() == 1
    mst_total = minimum_spanning_tree(squareform(pdist(x))).sum()
    assert diagram_summary(vietoris_rips_diagrams(x))["tp0"] == pytest.approx(mst_total, rel=1e-12)
    ripser_h0 = ripser(x, maxdim=0)["dgms"][0]
    assert P.total_persistence(ripser_h0) == pytest.approx(mst_total, rel=1e-5)  # ripser is float32


def test_duplicate_points_do_not_change_the_diagrams():
    x = np.random.default_rng(9).standard_normal((30, 3))
    doubled = np.concatenate([x, x[:10]])
    for a, b in zip(vietoris_rips_diagrams(x), vietoris_rips_diagrams(doubled), strict=True):
        np.testing.assert_allclose(np.sort(a, axis=0), np.sort(b, axis=0))


def test_noisy_circle_has_one_dominant_h1_bar():
    rng = np.random.default_rng(10)
    theta = rng.uniform(0, 2 * np.pi, 100)
    x = np.column_stack([np.cos(theta), np.sin(theta)]) + 0.05 * rng.standard_normal((100, 2))
    life = np.sort(P.persistence(vietoris_rips_diagrams(x)[1]))[::-1]
    assert life[0] > 1.0
    assert life[1] < 0.2 * life[0]


def test_diagrams_are_invariant_to_row_order_rotation_and_translation():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((50, 4))
    q, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    moved = (x @ q + 3.0)[rng.permutation(50)]
    a, b = diagram_summary(vietoris_rips_diagrams(x)), diagram_summary(vietoris_rips_diagrams(moved))
    for key in a:
        assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6)


def test_degenerate_clouds_give_finite_documented_values():
    for cloud in (np.ones((10, 3)), np.ones((1, 3))):
        summary = diagram_summary(vietoris_rips_diagrams(cloud))
        assert summary == {"tp0": 0, "tp1": 0, "entropy0": 0, "entropy1": 0, "count1": 0, "maxpers1": 0}
        features, _ = representation_topology(cloud, 500, 50, 0, 0.1, 4)
        assert all(np.isfinite(v) for v in features.values())
        assert features["rep_betti0_00"] == 1 and features["rep_betti1_03"] == 0


def test_subsample_is_seeded_and_keeps_small_clouds_whole():
    x = np.arange(40.0).reshape(20, 2)
    assert subsample_rows(x, 50, 0) is x
    np.testing.assert_array_equal(subsample_rows(x, 5, 3), subsample_rows(x, 5, 3))
    assert subsample_rows(x, 5, 3).shape == (5, 2)


# --- summaries ------------------------------------------------------------------------------


def test_entropy_and_betti_curve_by_hand():
    dgm = np.array([[0.0, 1.0], [0.0, 1.0], [0.0, 2.0], [0.0, np.inf]])
    p = np.array([0.25, 0.25, 0.5])
    assert persistence_entropy(dgm) == pytest.approx(-(p * np.log(p)).sum())
    np.testing.assert_array_equal(betti_curve(dgm, [0.0, 0.5, 1.0, 1.5, 2.0]), [4, 4, 2, 2, 1])
    assert P.significant_count(dgm, 0.6) == 1
    assert persistence_entropy(np.empty((0, 2))) == 0.0


# --- distances ------------------------------------------------------------------------------


def random_diagram(rng, k):
    birth = rng.random(k)
    return np.column_stack([birth, birth + rng.random(k)])


def test_distance_of_a_diagram_to_itself_is_zero():
    dgm = random_diagram(np.random.default_rng(12), 30)
    assert wasserstein_distance(dgm, dgm) == pytest.approx(0.0, abs=1e-12)
    assert bottleneck_distance(dgm, dgm) == 0.0


@pytest.mark.parametrize("sizes", [(0, 4), (4, 0), (1, 1), (6, 9), (25, 20)])
def test_distances_equal_persim(sizes):
    rng = np.random.default_rng(sum(sizes))
    a, b = random_diagram(rng, sizes[0]), random_diagram(rng, sizes[1])
    assert wasserstein_distance(a, b) == pytest.approx(persim.wasserstein(a, b), abs=1e-12)
    assert bottleneck_distance(a, b) == pytest.approx(persim.bottleneck(a, b), abs=1e-12)


def test_infinite_bars_are_dropped_explicitly():
    a = np.array([[0.0, 1.0], [0.0, np.inf]])
    b = np.array([[0.0, 1.5], [0.0, np.inf]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ours must not rely on persim's warning path
        assert wasserstein_distance(a, b) == pytest.approx(0.5)
        assert bottleneck_distance(a, b) == pytest.approx(0.5)
    assert wasserstein_distance(np.empty((0, 2)), np.empty((0, 2))) == 0.0


# --- dense Boruvka (small layers, Euclidean MST) and the ripser core ------------------------


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


@pytest.mark.parametrize("seed", range(12))
def test_small_layer_path_matches_brute_force_with_heavy_ties(seed):
    # Few distinct values (many ties), dead rows and columns, thin shapes, both dtypes.
    rng = np.random.default_rng(100 + seed)
    for n, m in [(1, 1), (1, 9), (9, 1), (2, 2), (5, 3), (3, 17), (24, 8), (8, 32), (48, 16)]:
        w = rng.integers(-2, 3, (n, m)).astype(np.float32 if seed % 2 else np.float64)
        w[rng.random(n) < 0.2] = 0.0
        w[:, rng.random(m) < 0.2] = 0.0
        assert w.size <= P._SMALL_LAYER_EDGES
        np.testing.assert_array_equal(bipartite_max_spanning_tree(w), brute_force_tree(w))


@pytest.mark.parametrize(
    "w",
    [
        np.zeros((1, 6)),
        np.zeros((6, 1)),
        np.ones((1, 6)),
        np.ones((7, 3)),
        np.array([[5.0, 5.0, 1.0], [5.0, 5.0, 1.0], [1.0, 1.0, 5.0]]),
        np.kron(np.eye(3), np.ones((2, 2))),  # three equal blocks joined only by zero edges
    ],
)
def test_small_layer_path_on_degenerate_layers(w):
    np.testing.assert_array_equal(bipartite_max_spanning_tree(w), brute_force_tree(w))


def test_small_layer_path_agrees_with_the_banded_path(monkeypatch):
    rng = np.random.default_rng(13)
    layers = [trained_like((192, 48), 14), trained_like((48, 192), 15), np.round(rng.standard_normal((96, 24)) * 2)]
    dense = [bipartite_max_spanning_tree(w) for w in layers]
    monkeypatch.setattr(P, "_SMALL_LAYER_EDGES", 0)  # every layer through band + Kruskal
    for w, expected in zip(layers, dense, strict=True):
        np.testing.assert_array_equal(bipartite_max_spanning_tree(w), expected)


@pytest.mark.parametrize("seed", range(8))
def test_dense_max_tree_matches_brute_force_on_tied_complete_graphs(seed):
    rng = np.random.default_rng(200 + seed)
    for k in (1, 2, 3, 5, 16, 40):
        upper = np.triu(rng.integers(0, 4, (k, k)).astype(float), k=1)
        weights = upper + upper.T
        np.fill_diagonal(weights, -np.inf)
        tree = np.sort(P._dense_max_tree(weights.copy()))
        # max tree of w = min tree of (c - w): same edges, so compare through the min reference
        np.testing.assert_array_equal(tree, np.sort(5.0 - brute_force_min_tree(5.0 - upper - upper.T)))


@pytest.mark.parametrize("seed", range(8))
def test_euclidean_mst_matches_scipy_and_brute_force_with_ties(seed):
    rng = np.random.default_rng(300 + seed)
    for n in (2, 3, 7, 60, 200):
        # Integer grid points: many equal distances; duplicates removed as in vietoris_rips_diagrams.
        x = np.unique(rng.integers(0, 6, (n, 3)).astype(float), axis=0)
        dist = squareform(pdist(x))
        tree = np.sort(P.euclidean_mst_lengths(dist))
        np.testing.assert_array_equal(tree, brute_force_min_tree(dist))
        np.testing.assert_array_equal(tree, np.sort(minimum_spanning_tree(dist).data))


def test_h0_equals_scipy_mst_on_gaussian_clouds():
    for n in (1, 2, 5, 199):
        x = np.random.default_rng(n).standard_normal((n, 48))
        h0 = vietoris_rips_diagrams(x)[0]
        expected = np.sort(minimum_spanning_tree(squareform(pdist(x))).data)
        np.testing.assert_array_equal(h0[:-1, 1], expected)
        np.testing.assert_array_equal(h0[-1], [0.0, np.inf])


@pytest.mark.parametrize("cloud", ["gaussian", "grid"])
def test_h1_equals_the_ripser_wrapper(cloud, monkeypatch):
    from ripser import ripser

    rng = np.random.default_rng(16)
    x = rng.standard_normal((120, 8)) if cloud == "gaussian" else np.unique(rng.integers(0, 4, (80, 3)), axis=0) * 1.0
    dist = squareform(pdist(x))
    reference = ripser(dist, maxdim=1, distance_matrix=True)["dgms"]
    for got, expected in zip(P._ripser_diagrams(dist), reference, strict=True):
        np.testing.assert_array_equal(got, expected)
    h1 = vietoris_rips_diagrams(x)[1]  # points reordered for ripser, bars put back in its order
    np.testing.assert_array_equal(h1, reference[1])
    assert np.all(np.diff(h1[:, 0]) <= 0)
    if cloud == "grid":
        assert np.any(np.diff(h1[:, 0]) == 0)  # equal births: the rerun in the original order
    monkeypatch.setattr(P, "_rips_filtration", None)  # the fallback through the wrapper
    np.testing.assert_array_equal(vietoris_rips_diagrams(x)[1], h1)
