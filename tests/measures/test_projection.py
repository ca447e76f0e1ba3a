"""The sparse JL projection: reproducible in any slices, linear, and keeping distances as its bound says."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chi2, chisquare

from topometrics.measures.projection import nonzeros, project, projection_rows, workspace_bytes

K = 64


def dense_matrix(n: int, k: int, seed: int) -> np.ndarray:
    """P (n, k) written out from its nonzeros' split columns: an independent reading of the layout."""
    s, m = nonzeros(k), k // nonzeros(k)
    out = np.zeros((n, k))
    for row, split in enumerate(projection_rows(n, 0, k, seed)):
        for column in split:
            block, rest = divmod(int(column), 2 * m)
            sign, bucket = divmod(rest, m)
            assert out[row, block * m + bucket] == 0  # one nonzero per block
            out[row, block * m + bucket] = (-1.0 if sign else 1.0) / np.sqrt(s)
    return out


def test_the_matrix_has_s_signed_nonzeros_a_row_one_per_block():
    p = dense_matrix(500, K, seed=1)
    assert (np.count_nonzero(p, axis=1) == 8).all() and nonzeros(K) == 8
    assert np.allclose(np.abs(p[p != 0]), 1 / np.sqrt(8))
    np.testing.assert_allclose((p**2).sum(axis=1), 1.0)  # every row a unit vector: |e_i P| = 1
    assert 0.45 < (p > 0).sum() / (p != 0).sum() < 0.55
    x = np.random.default_rng(0).normal(size=(3, 500))
    np.testing.assert_allclose(project(x, K, 1), x @ p, rtol=1e-12, atol=1e-12)
    assert nonzeros(10) == 5 and nonzeros(7) == 7 and nonzeros(11) == 1 and workspace_bytes(K) == 224


def test_rows_depend_on_the_seed_and_the_coordinate_only():
    whole = projection_rows(1001, 0, K, seed=7)
    for offset, n in ((0, 1), (1, 5), (3, 17), (999, 2), (500, 501)):  # every word alignment
        assert np.array_equal(projection_rows(n, offset, K, seed=7), whole[offset : offset + n])
    assert not np.array_equal(projection_rows(1001, 0, K, seed=8), whole)
    assert np.array_equal(projection_rows(50, 0, 10, seed=7), projection_rows(60, 0, 10, seed=7)[:50])  # m = 2, s = 5


def test_the_same_seed_gives_the_same_sketch_and_slices_sum_to_the_whole():
    x = np.random.default_rng(2).normal(size=(4, 70_001)).astype(np.float32)
    whole = project(x, K, seed=3)
    assert np.array_equal(whole, project(x, K, seed=3))
    assert np.array_equal(whole, project(x.copy(), K, seed=3))
    np.testing.assert_allclose(project(x, K, seed=3, chunk=997), whole, rtol=1e-12, atol=1e-12)
    # streamed as the code streams it: slices at their offsets, in any order, added into one output
    out = None
    for start, stop in ((40_000, 70_001), (0, 123), (123, 40_000)):
        out = project(x[:, start:stop], K, seed=3, offset=start, out=out)
    np.testing.assert_allclose(out, whole, rtol=1e-12, atol=1e-12)
    single = project(x[0], K, seed=3)  # one vector: (k,)
    assert single.shape == (K,)
    np.testing.assert_allclose(single, whole[0], rtol=1e-12, atol=1e-12)
    assert not np.allclose(project(x, K, seed=4), whole)


def test_the_sketch_is_linear():
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=3000), rng.standard_t(2, size=3000)
    px, py = project(x, K, 5), project(y, K, 5)
    np.testing.assert_allclose(project(2.5 * x - 0.75 * y, K, 5), 2.5 * px - 0.75 * py, rtol=1e-12, atol=1e-12)


def ratios(d: np.ndarray, seeds: range, k: int = K) -> np.ndarray:
    """``|d P_seed|^2 / |d|^2`` over the seeds: the distortion of one fixed difference vector."""
    return np.array([np.sum(project(d, k, seed) ** 2) for seed in seeds]) / np.sum(d**2)


# The Gaussian matrix's ratio |d P|^2 / |d|^2 is chi^2_64 / 64: 95 % of them within these.
LOW, HIGH = chi2.ppf(0.025, K) / K, chi2.ppf(0.975, K) / K  # 0.68, 1.38 (of distances: 0.83, 1.17)


@pytest.mark.parametrize("kind", ["gaussian", "heavy_tailed", "weight_difference"])
def test_a_fixed_distance_is_kept_as_the_jl_bound_says_over_seeds(kind):
    rng = np.random.default_rng(4)
    n = 4000
    d = {
        "gaussian": rng.normal(size=n),
        "heavy_tailed": rng.standard_t(3, size=n),  # a few coordinates carry much of the norm
        "weight_difference": rng.normal(size=n) * 0.02 + (rng.random(n) < 0.01) * rng.normal(size=n),
    }[kind]
    r = ratios(d, range(2000))
    # known answer: E r = 1 exactly and Var r = (2/k)(1 - |d|_4^4 / |d|_2^4) (at most the Gaussian's 2/k)
    var = 2 / K * (1 - np.sum(d**4) / np.sum(d**2) ** 2)
    assert abs(r.mean() - 1) < 4 * np.sqrt(var / r.size)
    assert r.var(ddof=1) == pytest.approx(var, rel=0.15)  # sampling SE of a variance at n = 2000: about 4 %
    inside = np.mean((r >= LOW) & (r <= HIGH))
    assert inside >= 0.95 - 3 * np.sqrt(0.95 * 0.05 / r.size)  # at least the Gaussian's 95 %
    distances = np.sqrt(r)
    assert np.quantile(np.abs(distances - 1), 0.95) < 0.19  # 95 % of distance ratios within 1 +- 0.19


def test_random_point_sets_keep_their_pairwise_distances():
    # 30 points in 20,000 dimensions, one projection: 435 pairwise distance ratios
    rng = np.random.default_rng(5)
    points = rng.normal(size=(30, 20_000)) * rng.uniform(0.1, 10, size=(30, 1))
    sketch = project(points, K, seed=11)
    i, j = np.triu_indices(30, 1)
    r = np.linalg.norm(sketch[i] - sketch[j], axis=1) / np.linalg.norm(points[i] - points[j], axis=1)
    assert abs(np.mean(r**2) - 1) < 0.05
    assert np.mean((r**2 >= LOW) & (r**2 <= HIGH)) >= 0.9


def test_sparse_inputs_one_coordinate_is_exact_two_collide_with_the_stated_probability():
    d = np.zeros(5000)
    d[1234] = 3.0
    assert all(abs(np.linalg.norm(project(d, K, seed)) - 3.0) < 1e-12 for seed in range(50))
    e = np.zeros(5000)
    e[[10, 4000]] = 1.0
    r = ratios(e, range(2000))
    # |e P|^2 = 2 + (2/s) sum_b eps_b: in each of the s = 8 blocks the two share a bucket with probability 1/m = 1/8,
    # eps_b = +-1 (the signs' product), else 0; r = 1 + (sum eps_b) / 8, whose law is the 8-fold convolution below
    j = np.round((r - 1) * 8)
    np.testing.assert_allclose(r, 1 + j / 8, atol=1e-9)
    law = np.array([1.0])
    for _ in range(8):
        law = np.convolve(law, [1 / 16, 7 / 8, 1 / 16])  # j = -8 .. 8
    assert law[8] == pytest.approx(0.4456, abs=1e-4)  # r exactly 1 (no shared bucket 0.344, or cancelling signs)
    counts = np.bincount((j + 8).astype(int), minlength=17)
    pooled = [slice(0, 6), *(slice(i, i + 1) for i in range(6, 11)), slice(11, 17)]  # |j| >= 3 pooled
    seen, expected = (np.array([v[part].sum() for part in pooled]) for v in (counts, law * r.size))
    assert chisquare(seen, expected).pvalue > 0.01
    assert abs(r.mean() - 1) < 0.02
