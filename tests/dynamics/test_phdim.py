"""The PH0 dimension: known dimensions of seeded clouds, invariances, the exponent's ceiling, too few points."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.sparse.csgraph import minimum_spanning_tree
from scipy.spatial.distance import pdist, squareform
from scipy.stats import special_ortho_group

from topometrics.dynamics.phdim import MIN_SIZE, h0_alpha_weight, ph_dimension, trailing_dimension

SIZES = tuple(range(200, 1001, 100))  # the subsample sizes every known answer below uses, of 1000 points


def sierpinski(n: int, rng: np.random.Generator) -> np.ndarray:
    """The chaos game on the triangle's corners (after 100 burn-in steps): points on the Sierpinski triangle."""
    corners = np.array([[0.0, 0.0], [1.0, 0.0], [0.5, np.sqrt(3) / 2]])
    p, out = np.zeros(2), []
    for k in rng.integers(3, size=n + 100):
        p = (p + corners[k]) / 2
        out.append(p)
    return np.array(out[100:])


def cantor(n: int, rng: np.random.Generator, digits: int = 30) -> np.ndarray:
    """Points of the middle-thirds Cantor set (dimension log 2 / log 3 = 0.631): ternary digits 0 or 2."""
    d = 2 * rng.integers(0, 2, size=(n, digits))
    return (d * 3.0 ** -np.arange(1, digits + 1)).sum(axis=1)[:, None]


def test_h0_alpha_weight_is_the_spanning_tree_sum_scipy_finds():
    pts = np.random.default_rng(1).normal(size=(60, 4))
    edges = minimum_spanning_tree(squareform(pdist(pts))).data
    assert h0_alpha_weight(pts, 1.0) == pytest.approx(edges.sum(), rel=1e-12)
    assert h0_alpha_weight(pts, 0.5) == pytest.approx(np.sqrt(edges).sum(), rel=1e-12)


@pytest.mark.parametrize(
    ("name", "make", "truth", "tol", "draws"),
    [
        ("segment", lambda rng: rng.uniform(size=(1000, 1)) * [[1.0, -2.0, 0.5]], 1.0, 0.1, 1),
        ("square", lambda rng: rng.uniform(size=(1000, 2)), 2.0, 0.15, 1),
        # the cube's estimate runs low at 1000 points (boundary effects, ~0.1); three draws per size steady it
        ("cube", lambda rng: rng.uniform(size=(1000, 3)), 3.0, 0.2, 3),
        ("sierpinski", lambda rng: sierpinski(1000, rng), np.log(3) / np.log(2), 0.1, 1),
    ],
)
def test_known_dimensions(name, make, truth, tol, draws):
    est = ph_dimension(make(np.random.default_rng(0)), SIZES, alpha=1.0, seed=0, draws=draws)
    assert est.reason is None and est.sizes == SIZES and est.n_points == 1000
    assert est.dimension == pytest.approx(truth, abs=tol), name


def test_the_exponent_must_lie_below_the_true_dimension():
    # A Cantor set (0.631): alpha = 1 bounds E_alpha, the slope goes to 0 and the estimate reads alpha itself;
    # alpha = 0.25 sees the set's own dimension.
    pts = cantor(1000, np.random.default_rng(0))
    assert ph_dimension(pts, SIZES, alpha=1.0).dimension == pytest.approx(1.0, abs=0.02)
    assert ph_dimension(pts, SIZES, alpha=0.25).dimension == pytest.approx(np.log(2) / np.log(3), abs=0.05)


def test_scaling_rotating_and_moving_the_cloud_leave_the_estimate():
    rng = np.random.default_rng(3)
    pts = rng.normal(size=(300, 5)) @ np.diag([3.0, 1.0, 1.0, 0.2, 0.1])
    rot = special_ortho_group.rvs(5, random_state=4)
    base = ph_dimension(pts, (50, 100, 200, 300), seed=7).dimension
    assert np.isfinite(base)
    assert ph_dimension(1e-3 * pts, (50, 100, 200, 300), seed=7).dimension == pytest.approx(base, rel=1e-9)
    assert ph_dimension(pts @ rot.T + 5.0, (50, 100, 200, 300), seed=7).dimension == pytest.approx(base, rel=1e-6)


def test_too_few_points_give_null_with_a_reason():
    pts = np.random.default_rng(0).uniform(size=(20, 2))
    est = ph_dimension(pts, (10, 20, 40, 80))  # only 10 and 20 fit in 20 points
    assert np.isnan(est.dimension) and est.sizes == (10, 20) and "fewer than the 3" in est.reason
    est = ph_dimension(pts[:5], (2, 4, 5))  # every size below MIN_SIZE
    assert np.isnan(est.dimension) and est.sizes == () and MIN_SIZE > 5


def test_coincident_or_non_finite_points_give_null_with_a_reason():
    same = np.ones((50, 3))
    assert "coincide" in ph_dimension(same, (10, 20, 50)).reason
    bad = np.random.default_rng(0).normal(size=(50, 3))
    bad[4, 1] = np.nan
    assert "non-finite" in ph_dimension(bad, (10, 20, 50)).reason


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="alpha"):
        ph_dimension(np.zeros((10, 2)), (8, 9, 10), alpha=0.0)
    with pytest.raises(ValueError, match="shape"):
        ph_dimension(np.zeros(10), (8, 9, 10))


def test_a_trailing_window_takes_only_its_iterates():
    rng = np.random.default_rng(5)
    steps = np.arange(0, 2000, 10)  # 200 iterates: a segment for the first 100, a square after
    points = np.vstack([np.c_[rng.uniform(size=100), np.zeros(100)], rng.uniform(size=(100, 2))])
    sizes = (40, 60, 80, 100)
    square = trailing_dimension(steps, points, 1990, 1000, sizes, seed=1, draws=3)
    segment = trailing_dimension(steps, points, 990, 1000, sizes, seed=1, draws=3)
    assert square.n_points == 100 and segment.n_points == 100
    assert ph_dimension(points[100:], sizes, seed=1, draws=3) == square
    assert segment.dimension == pytest.approx(1.0, abs=0.1) and square.dimension > 1.6
    short = trailing_dimension(steps, points, 990, 150, sizes)
    assert np.isnan(short.dimension) and short.reason.startswith("steps 841..990: 15 points allow 0 subsample sizes")
