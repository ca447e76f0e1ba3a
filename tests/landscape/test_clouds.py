"""A cloud in column chunks: its Gram matrix and distances in one pass against pdist, near-parallel pairs, the
pieces' sizes, and the noise scale and cosine against their definitions."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.distance import pdist, squareform

from topometrics.landscape.clouds import (
    BLOCK_VALUES,
    CHUNK_VALUES,
    NEAR,
    block_values,
    chunk_values,
    cloud_distances,
    cloud_geometry,
    mean_cosine,
    noise_scale,
)


def test_cloud_distances_in_column_chunks_equal_pdist_raw_and_unit(monkeypatch):
    import topometrics.landscape.clouds as C

    monkeypatch.setattr(C, "CHUNK_VALUES", 6 * 7)  # 7 columns a piece: 100 columns in 15 pieces
    monkeypatch.setattr(C, "BLOCK_VALUES", 6 * 20)  # in blocks of 20 columns
    monkeypatch.setattr(C, "LAYER_SHARE", 1)
    points = np.random.default_rng(3).normal(size=(6, 100)).astype(np.float32)
    points[4] = points[1]  # equal rows: exactly 0 apart
    points[5] = 0.0  # a zero row: no direction, dropped from the unit cloud
    raw, unit = cloud_distances(points)
    np.testing.assert_allclose(raw, squareform(pdist(points.astype(np.float64))), rtol=1e-12, atol=0)
    assert raw[1, 4] == 0.0 and raw[4, 1] == 0.0
    directions = points[:5].astype(np.float64) / np.linalg.norm(points[:5].astype(np.float64), axis=1)[:, None]
    np.testing.assert_allclose(unit, squareform(pdist(directions)), rtol=1e-12, atol=1e-15)


def _exact(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Raw and unit-row distances from sums of squared differences in float64 (no Gram matrix)."""
    points = points.astype(np.float64)
    directions = points / np.linalg.norm(points, axis=1, keepdims=True)
    return squareform(pdist(points)), squareform(pdist(directions))


def test_distances_from_the_gram_matrix_keep_ten_digits_up_to_the_near_threshold_and_exact_ones_past_it():
    rng = np.random.default_rng(4)
    base = rng.normal(size=(3, 5000))
    base[2] -= base[2] @ base[0] / (base[0] @ base[0]) * base[0]  # orthogonal to row 0
    base[2] /= np.linalg.norm(base[2])
    base[0] /= np.linalg.norm(base[0])
    rows = [base[0], base[1], 3.0 * base[0]]  # parallel, 3x the norm: 0 apart as directions
    for gap in (2.0 * NEAR, 1.01 * NEAR, 0.99 * NEAR, 1e-7, 1e-12):  # 1 - cos of (row 0, new row)
        angle = np.arccos(1.0 - gap)
        rows.append(np.cos(angle) * base[0] + np.sin(angle) * base[2])
    points = np.stack(rows)
    raw, unit = cloud_distances(points)
    exact_raw, exact_unit = _exact(points)
    np.testing.assert_allclose(raw, exact_raw, rtol=1e-9, atol=0)
    np.testing.assert_allclose(unit, exact_unit, rtol=1e-9, atol=1e-15)
    assert unit[0, 2] == pytest.approx(0.0, abs=1e-15)  # past the threshold: summed from differences


def test_one_pass_over_the_chunks_unless_a_pair_is_near_parallel():
    points = np.random.default_rng(5).normal(size=(6, 300))
    calls = []

    def chunks():
        calls.append(1)
        return iter([points[:, :100], points[:, 100:]])

    gram, raw, unit = cloud_geometry(chunks, 6, 300)
    assert len(calls) == 1
    np.testing.assert_allclose(gram, points @ points.T, rtol=1e-12)
    np.testing.assert_allclose(raw, _exact(points)[0], rtol=1e-10)
    points[3] = points[0]
    calls.clear()
    raw = cloud_geometry(chunks, 6, 300)[1]
    assert len(calls) == 2 and raw[0, 3] == raw[3, 0] == 0.0


def test_a_clouds_pieces_and_blocks_are_a_fraction_of_it():
    for numel in (1, 100, 2304, 9216, 1 << 20):  # one weight, xl's layers, a Pythia-70m MLP layer
        cloud_float32 = 16 * numel * 4  # bytes of 16 examples' gradients, whole
        assert 1 <= chunk_values(16, numel) <= CHUNK_VALUES
        assert chunk_values(16, numel) * 8 <= max(8, cloud_float32 // 8)  # a float64 piece: 1/8 of the cloud
        assert 1 <= block_values(16, numel) <= BLOCK_VALUES
        assert block_values(16, numel) * 4 <= max(4, cloud_float32 // 16)  # a float32 block: 1/16 of it
    assert chunk_values(16, 1 << 20) == CHUNK_VALUES


def test_noise_scale_and_cosine_against_their_definitions():
    g = np.random.default_rng(2).normal(size=(7, 40)) + 0.5
    mean = g.mean(axis=0)
    trace = np.trace(np.cov(g, rowvar=False))  # ddof 1, as McCandlish et al.'s estimator
    assert noise_scale(g @ g.T) == pytest.approx(trace / (mean @ mean), rel=1e-10)
    unit = g / np.linalg.norm(g, axis=1, keepdims=True)
    cos = unit @ unit.T
    assert mean_cosine(g @ g.T) == pytest.approx(cos[np.triu_indices(7, 1)].mean(), rel=1e-12)
    opposite = np.array([[1.0, 0.0], [-1.0, 0.0]])
    assert np.isnan(noise_scale(opposite @ opposite.T)) and mean_cosine(opposite @ opposite.T) == -1.0
