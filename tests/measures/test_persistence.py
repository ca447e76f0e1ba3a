"""topometrics.measures.persistence: Vietoris-Rips against the MST and ripser, known shapes, persim distances."""

from __future__ import annotations

import warnings

import numpy as np
import persim
import pytest
from scipy.sparse.csgraph import minimum_spanning_tree
from scipy.spatial.distance import pdist, squareform

from tests.measures.helpers import brute_force_min_tree
from topometrics.measures import persistence as P
from topometrics.measures.persistence import (
    betti_curve,
    bottleneck_distance,
    diagram_summary,
    persistence_entropy,
    subsample_rows,
    vietoris_rips_diagrams,
    wasserstein_distance,
)


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


def test_subsample_is_seeded_and_keeps_small_clouds_whole():
    x = np.arange(40.0).reshape(20, 2)
    assert subsample_rows(x, 50, 0) is x
    np.testing.assert_array_equal(subsample_rows(x, 5, 3), subsample_rows(x, 5, 3))
    assert subsample_rows(x, 5, 3).shape == (5, 2)


@pytest.mark.parametrize("k", [1, 2, 31, 32, 33, 70])
def test_row_distances_equal_pdist_bit_for_bit_across_block_boundaries(k):
    layer = np.random.default_rng(k).standard_normal((90, 37)).astype(np.float32)
    rows = P.subsample_indices(90, k, seed=5)
    want = squareform(pdist(layer[rows].astype(np.float64) / 3.5))
    got = P.row_distances(layer, rows, scale=3.5)
    assert got.dtype == np.float64 and got.shape == (k, k)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(P.row_distances(layer[:k]), squareform(pdist(layer[:k].astype(np.float64))))


def test_subsample_indices_are_the_rows_subsample_rows_takes():
    x = np.random.default_rng(2).standard_normal((50, 3))
    rows = P.subsample_indices(50, 7, seed=11)
    assert list(rows) == sorted(set(rows)) and rows.size == 7
    np.testing.assert_array_equal(subsample_rows(x, 7, 11), x[rows])
    np.testing.assert_array_equal(P.subsample_indices(5, 7, seed=11), np.arange(5))
    with pytest.raises(ValueError, match="max_points must be positive"):
        P.subsample_indices(5, 0, seed=1)


def test_a_non_finite_row_is_refused():
    x = np.random.default_rng(3).standard_normal((10, 4))
    for bad in (np.nan, np.inf):
        x[4, 2] = bad
        with pytest.raises(ValueError, match="NaN/Inf"):
            vietoris_rips_diagrams(x)


def test_entropy_and_betti_curve_by_hand():
    dgm = np.array([[0.0, 1.0], [0.0, 1.0], [0.0, 2.0], [0.0, np.inf]])
    p = np.array([0.25, 0.25, 0.5])
    assert persistence_entropy(dgm) == pytest.approx(-(p * np.log(p)).sum())
    np.testing.assert_array_equal(betti_curve(dgm, [0.0, 0.5, 1.0, 1.5, 2.0]), [4, 4, 2, 2, 1])
    assert P.significant_count(dgm, 0.6) == 1
    assert persistence_entropy(np.empty((0, 2))) == 0.0


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


@pytest.mark.parametrize("seed", range(4))
def test_the_bottleneck_of_nearby_diagrams_equals_persims(seed):
    """Consecutive checkpoints' diagrams: each bar moves a little, so the bounds the search starts from (each bar's
    cheaper of its nearest partner and the diagonal; the longest half lifetime) are tight."""
    rng = np.random.default_rng(seed)
    a = random_diagram(rng, 40)
    b = np.vstack([a[:-3] + rng.normal(0, 0.01, (37, 2)), random_diagram(rng, 2)])
    b[:, 1] = np.maximum(b[:, 1], b[:, 0])
    assert bottleneck_distance(a, b) == pytest.approx(persim.bottleneck(a, b), abs=1e-12)
    assert bottleneck_distance(b, a) == bottleneck_distance(a, b)


def test_infinite_bars_are_dropped_explicitly():
    a = np.array([[0.0, 1.0], [0.0, np.inf]])
    b = np.array([[0.0, 1.5], [0.0, np.inf]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ours must not rely on persim's warning path
        assert wasserstein_distance(a, b) == pytest.approx(0.5)
        assert bottleneck_distance(a, b) == pytest.approx(0.5)
    assert wasserstein_distance(np.empty((0, 2)), np.empty((0, 2))) == 0.0


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
