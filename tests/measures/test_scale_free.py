"""Tests of topometrics.measures.scale_free: independent computations and exact scale/permutation invariance."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.sparse.csgraph import minimum_spanning_tree

from tests.measures.helpers import brute_force_tree, trained_like  # the one brute-force Kruskal oracle
from tests.repo_params import features_params
from topometrics.measures import row_blocks
from topometrics.measures import scale_free as S
from topometrics.measures.layer_features import aggregate_layers, layer_features
from topometrics.measures.neural_persistence import bipartite_max_spanning_tree, neural_persistence
from topometrics.measures.persistence import vietoris_rips_diagrams
from topometrics.measures.spanning_tree import random_arrangement_tree
from topometrics.vocabulary import SCALE_FREE, per_layer


def unit_rows(weight: np.ndarray) -> np.ndarray:
    """Reference: rows scaled to unit length, all-zero rows dropped (a full float64 copy)."""
    w = np.asarray(weight, dtype=np.float64)
    norms = np.linalg.norm(w, axis=1)
    keep = norms > 0
    return w[keep] / norms[keep, None]


def farthest_points(points: np.ndarray, count: int) -> np.ndarray:
    """Reference: greedy farthest-point (max-min) sampling of a materialised cloud, in the order chosen.

    Starts from the row farthest from the centroid and repeatedly adds the row
    farthest from those chosen: a deterministic subsample that covers the cloud (every dropped row
    lies within the last chosen distance of a kept one) and depends only on the rows' values, so
    permuting the rows does not change it. Clouds that fit are returned whole.
    """
    points = np.asarray(points, dtype=np.float64)
    if points.shape[0] <= count:
        return points
    centred = points - points.mean(axis=0)
    chosen = [int(np.argmax(np.einsum("ij,ij->i", centred, centred)))]
    gap = np.linalg.norm(points - points[chosen[0]], axis=1)
    for _ in range(count - 1):
        chosen.append(int(np.argmax(gap)))
        gap = np.minimum(gap, np.linalg.norm(points - points[chosen[-1]], axis=1))
    return points[chosen]


def every_scale_free_feature(w, params=None, index=0):
    """The scale-free values of a layer as the features stage computes them (np_excess included)."""
    values, _, _ = layer_features(np.array(w), float(np.abs(w).max()), params or features_params(), index)
    return {name: values[name] for name in per_layer(SCALE_FREE)}


def test_unit_row_h0_is_the_mst_of_chord_distances():
    w = trained_like((40, 12), 0)
    cos = (w @ w.T) / np.outer(np.linalg.norm(w, axis=1), np.linalg.norm(w, axis=1))
    chord = np.sqrt(np.clip(2 - 2 * cos, 0, None))
    np.fill_diagonal(chord, 0)
    mst = minimum_spanning_tree(chord).data
    f = every_scale_free_feature(w)
    assert f["vr_unit_tp0"] == pytest.approx(mst.sum(), abs=1e-9)
    assert np.all(mst <= 2 + 1e-12)  # chords of unit vectors


def test_fnorm_diagrams_are_the_plain_diagrams_divided_by_the_norm():
    w = trained_like((30, 10), 1)
    plain = vietoris_rips_diagrams(w)
    f = every_scale_free_feature(w)
    norm = np.linalg.norm(w)
    finite = plain[0][np.isfinite(plain[0][:, 1])]
    assert f["vr_fnorm_tp0"] == pytest.approx(finite[:, 1].sum() / norm, rel=1e-12)
    h1 = plain[1][:, 1] - plain[1][:, 0]
    assert f["vr_fnorm_tp1"] == pytest.approx(h1.sum() / norm, rel=1e-5)  # ripser is float32
    assert f["vr_fnorm_count1"] == len(h1)


def test_np_excess_is_np_minus_the_mean_null_by_direct_subtraction():
    w = trained_like((12, 9), 2)
    a = np.abs(w)
    top = a.max()

    def direct_np(matrix):  # reference normalisation from a brute-force tree
        pers = 1 - brute_force_tree(matrix) / top
        return np.sqrt((np.sum(pers**2) + 1) / pers.size)

    def tree_np(tree):
        pers = 1 - tree / top
        return np.sqrt((np.sum(pers**2) + 1) / pers.size)

    descending = np.sort(a.ravel())[::-1]  # draw k: the tree of a random arrangement, default_rng([5, 1, k])
    nulls = [tree_np(random_arrangement_tree(descending, *a.shape, np.random.default_rng([5, 1, k]))) for k in range(4)]
    entries = w.copy()
    assert S.np_excess(brute_force_tree(a), entries, 4, [5, 1]) == pytest.approx(
        direct_np(a) - np.mean(nulls), abs=1e-12
    )
    assert direct_np(a) == pytest.approx(neural_persistence(w, top).np_norm, abs=1e-12)
    np.testing.assert_array_equal(entries.ravel(), np.sort(a.ravel()))  # written over: |w| sorted, as documented
    with pytest.raises(ValueError, match="C-contiguous"):
        S.np_excess(brute_force_tree(a), np.asfortranarray(w), 4, [5, 1])


def test_np_z_by_hand():
    w = np.array([[3.0, -1.0], [0.0, 2.0]])  # |w| = 3, 1, 0, 2; tree = 3, 2, 1 (3 vertices... 4 - 1 edges)
    a = np.abs(w)
    sd = a.std()
    tree = np.array([3.0, 2.0, 1.0])
    assert S.np_zscored(w, tree) == pytest.approx(np.sqrt(np.mean(((3 - tree) / sd) ** 2)), abs=1e-12)
    assert np.array_equal(bipartite_max_spanning_tree(w), tree)
    ones = np.ones((3, 3))  # constant |w|: no spread to standardise by
    assert np.isnan(S.np_zscored(ones, bipartite_max_spanning_tree(ones)))


@pytest.mark.parametrize("c", [1e-3, 0.37, 1.0, 7.0, 1e4])
def test_scaling_and_row_permutation_leave_every_scale_free_feature_unchanged(c):
    w = trained_like((48, 16), 3)
    params = features_params(null_draws=3, unit_points=32)
    base = every_scale_free_feature(w, params, 1)
    perm = np.random.default_rng(9).permutation(w.shape[0])
    moved = every_scale_free_feature(c * w[perm], params, 1)
    assert set(base) == set(per_layer(SCALE_FREE))
    for name in per_layer(SCALE_FREE):
        assert moved[name] == pytest.approx(base[name], abs=1e-9), name


def test_dead_rows_and_all_zero_layers():
    w = trained_like((10, 6), 4)
    w[3] = 0
    assert S.farthest_unit_rows(w, 64).shape == (9, 6)  # the dead row has no direction: dropped
    np.testing.assert_allclose(np.linalg.norm(S.farthest_unit_rows(w, 64), axis=1), 1.0)
    zero, _, _ = layer_features(np.zeros((5, 4)), 0.0, features_params(), 0)
    assert zero["vr_unit_tp0"] == 0 and zero["vr_fnorm_tp0"] == 0
    assert np.isnan(zero["np_excess"]) and np.isnan(zero["np_z"])


def test_aggregation_sums_vr_takes_max_of_maxpers_and_means_np_over_finite_layers():
    a = dict.fromkeys(per_layer(SCALE_FREE), 1.0) | {"vr_unit_maxpers1": 0.5, "np_excess": np.nan}
    b = dict.fromkeys(per_layer(SCALE_FREE), 2.0) | {"vr_unit_maxpers1": 0.25}
    out = aggregate_layers({"x": a, "y": b})
    assert out["vr_unit_tp0"] == 3.0 and out["vr_unit_maxpers1"] == 0.5
    assert out["np_excess"] == 2.0 and out["np_z"] == 1.5


def test_farthest_unit_rows_cover_the_cloud_and_ignore_row_order():
    w = trained_like((100, 8), 5)
    pts = unit_rows(w)
    kept = S.farthest_unit_rows(w, 20)
    assert kept.shape == (20, 8) and np.array_equal(kept[0], pts[np.argmax(np.linalg.norm(pts - pts.mean(0), axis=1))])
    cover = np.linalg.norm(pts[:, None] - kept[None], axis=2).min(axis=1).max()
    last = np.linalg.norm(kept[-1] - kept[:-1], axis=1).min()  # the max-min distance at the last pick
    assert cover <= last + 1e-12
    perm = np.random.default_rng(1).permutation(100)
    assert {tuple(r) for r in S.farthest_unit_rows(w[perm], 20)} == {tuple(r) for r in kept}
    assert len(S.farthest_unit_rows(w, 200)) == 100


@pytest.mark.parametrize("block_bytes", [64, 1 << 19])  # 64: a block per row, so every boundary is crossed
def test_farthest_unit_rows_streamed_equal_farthest_points_of_the_unit_rows(monkeypatch, block_bytes):
    monkeypatch.setattr(row_blocks, "BLOCK_BYTES", block_bytes)
    w = trained_like((90, 7), 6).astype(np.float32)
    w[[4, 50]] = 0  # dead rows are dropped, as unit_rows drops them
    expected = farthest_points(unit_rows(w), 16)
    np.testing.assert_array_equal(S.farthest_unit_rows(w, 16), expected)
    np.testing.assert_array_equal(S.farthest_unit_rows(w, 200), unit_rows(w))  # a cloud that fits: whole


@pytest.mark.parametrize(
    ("shape", "dtype", "duplicates"),
    [((600, 256), np.float32, False), ((300, 1024), np.float32, True), ((400, 96), np.float64, True)],
)
def test_the_screened_farthest_rows_are_the_float64_rules_on_near_equidistant_rows(shape, dtype, duplicates):
    # Gaussian rows (a layer at initialisation): every cosine near 0, the case where a float32 screen alone
    # would pick other rows; duplicated rows make exact ties (the first row wins, as the reference's argmax)
    w = np.random.default_rng(12).standard_normal(shape).astype(dtype)
    if duplicates:
        w[1::7] = w[::7][: w[1::7].shape[0]]
    expected = farthest_points(unit_rows(w), 40)
    np.testing.assert_allclose(S.farthest_unit_rows(w, 40), expected, rtol=0, atol=1e-15)


def test_the_screen_never_decides_between_rows_closer_than_its_rounding():
    # rows in pairs 1e-6 apart: a float32 screen cannot order a pair's cosines (4e-8 apart, its error 1.5e-5);
    # every pick is such a pair's, and the float64 recheck orders it as the reference does
    rng = np.random.default_rng(13)
    base = rng.standard_normal((150, 256)).astype(np.float32)
    partner = (base * (1 + 1e-6 * rng.standard_normal(base.shape))).astype(np.float32)
    w = np.empty((300, 256), dtype=np.float32)
    w[0::2], w[1::2] = base, partner
    assert not np.array_equal(w[0::2], w[1::2])
    np.testing.assert_allclose(S.farthest_unit_rows(w, 40), farthest_points(unit_rows(w), 40), rtol=0, atol=1e-15)
