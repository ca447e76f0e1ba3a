"""Tests of topometrics.measures.neural_persistence: brute-force union-find, hand-worked layers, both tree paths."""

from __future__ import annotations

import numpy as np
import pytest

from tests.measures.helpers import brute_force_tree
from topometrics.measures import neural_persistence as P
from topometrics.measures.neural_persistence import (
    bipartite_max_spanning_tree,
    neural_persistence,
    shuffled_neural_persistence,
    tree_persistence,
)
from topometrics.measures.spanning_tree import random_arrangement_tree


def trained_like(shape, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(shape) * np.exp(rng.standard_normal((shape[0], 1)))
    w *= np.exp(0.5 * rng.standard_normal((1, shape[1])))
    w[rng.random(shape[0]) < 0.1] = 0
    w[:, rng.random(shape[1]) < 0.05] = 0
    return w.astype(np.float32)


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


def test_shuffled_null_in_place_is_the_same_draw_and_tree_persistence_is_np():
    w = np.random.default_rng(3).standard_normal((30, 20)).astype(np.float32)
    buffer = w.copy()
    in_place = shuffled_neural_persistence(buffer, 4.0, [1, 2], in_place=True)
    assert in_place == shuffled_neural_persistence(w, 4.0, [1, 2])
    np.testing.assert_array_equal(buffer.ravel(), np.sort(np.abs(w.ravel())))  # the buffer: |w| sorted
    tree = random_arrangement_tree(np.sort(np.abs(w.ravel()))[::-1], 30, 20, np.random.default_rng([1, 2]))
    assert in_place == tree_persistence(tree, 4.0)
    with pytest.raises(ValueError, match="NaN/Inf"):
        shuffled_neural_persistence(np.full((300, 200), np.inf, dtype=np.float32), 4.0, 0)
    with pytest.raises(ValueError, match="C-contiguous"):
        shuffled_neural_persistence(np.asfortranarray(w), 4.0, 0, in_place=True)
    assert tree_persistence(bipartite_max_spanning_tree(w), 4.0) == neural_persistence(w, 4.0)
