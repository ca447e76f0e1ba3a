"""topometrics.landscape.curvature: Lanczos and Hutchinson against explicit Hessians, closed forms
(least squares, logistic regression) through autograd Hessian-vector products, and the 1/sqrt(probes) error."""

import numpy as np
import pytest
import torch

from topometrics.landscape.curvature import hutchinson_trace, top_eigenpairs
from topometrics.landscape.vectors import FileRows, read_part, read_row


def read_in(operator):
    """``operator`` given an array: a vector in a file (the two-pass path's with a spill folder) read whole."""
    return lambda v: operator(read_row(v, 0) if isinstance(v, FileRows) else v)


def symmetric(n, seed=0):
    a = np.random.default_rng(seed).standard_normal((n, n))
    return (a + a.T) / 2


def test_lanczos_finds_the_top_eigenpairs_of_a_symmetric_matrix():
    h = symmetric(40)
    result = top_eigenpairs(lambda v: h @ v, 40, k=3, iters=40)
    expected = np.linalg.eigvalsh(h)[::-1][:3]
    np.testing.assert_allclose(result.values, expected, rtol=1e-8)
    assert result.converged.all() and result.products == 40
    for value, vector in zip(result.values, result.vectors.T, strict=True):
        np.testing.assert_allclose(h @ vector, value * vector, atol=1e-8)


def test_an_exhausted_krylov_space_stops_early_and_is_exact():
    h = np.diag([5.0, 2.0, 2.0, 2.0, -1.0])  # three distinct eigenvalues: at most 3 steps
    result = top_eigenpairs(lambda v: h @ v, 5, k=2, iters=20)
    np.testing.assert_allclose(result.values, [5.0, 2.0], rtol=1e-10)
    assert result.products <= 3 and result.converged.all()


def test_too_few_steps_say_they_did_not_converge():
    h = np.diag(np.linspace(1.0, 1.001, 200))  # a clustered spectrum: 3 steps cannot resolve it
    assert not top_eigenpairs(lambda v: h @ v, 200, k=1, iters=3, tol=1e-12).converged.all()


def test_an_early_stop_returns_what_a_run_cut_at_that_step_returns_and_has_converged():
    h = np.diag(np.concatenate([[10.0, 7.0, 5.0], np.linspace(0.0, 1.0, 300)]))  # separated top three
    early = top_eigenpairs(lambda v: h @ v, 303, k=3, iters=60, tol=1e-6, stop_early=True)
    assert early.converged.all() and 3 <= early.products < 60
    cut = top_eigenpairs(lambda v: h @ v, 303, k=3, iters=early.products, tol=1e-6)
    assert np.array_equal(early.values, cut.values) and np.array_equal(early.vectors, cut.vectors)
    one_short = top_eigenpairs(lambda v: h @ v, 303, k=3, iters=early.products - 1, tol=1e-6)
    assert not one_short.converged.all()  # it stopped at the first step where all three had converged
    np.testing.assert_allclose(early.values, [10.0, 7.0, 5.0], rtol=1e-6)


def test_hutchinson_is_exact_on_a_diagonal_hessian_whatever_the_probes():
    d = np.random.default_rng(2).standard_normal(30)
    for probes in (1, 5):
        assert hutchinson_trace(lambda v: d * v, 30, probes, seed=probes).trace == pytest.approx(d.sum(), rel=1e-12)


def test_hutchinsons_error_shrinks_as_one_over_the_square_root_of_the_probes():
    h = symmetric(50, seed=3)
    exact = np.trace(h)
    errors = {}
    for probes in (4, 64):
        estimates = [hutchinson_trace(lambda v: h @ v, 50, probes, seed=s).trace for s in range(200)]
        errors[probes] = np.sqrt(np.mean((np.array(estimates) - exact) ** 2))
    # 16x the probes: the RMS error falls by 4x (the unbiased estimator's variance is sum_{i!=j} 2 h_ij^2 / probes)
    assert errors[4] / errors[64] == pytest.approx(4.0, rel=0.25)


def autograd_hvp(loss, w):
    """v -> H v of ``loss`` at ``w`` by double backward, on float64 numpy vectors."""
    w = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(loss(w), w, create_graph=True)

    def hvp(v):
        (hv,) = torch.autograd.grad(grad, w, torch.as_tensor(v), retain_graph=True)
        return hv.detach().numpy()

    return hvp


def test_least_squares_curvature_is_two_over_n_xtx():
    rng = np.random.default_rng(4)
    x, y = torch.tensor(rng.standard_normal((64, 6))), torch.tensor(rng.standard_normal(64))
    hvp = autograd_hvp(lambda w: ((x @ w - y) ** 2).mean(), rng.standard_normal(6))
    h = 2 / 64 * (x.T @ x).numpy()
    np.testing.assert_allclose(top_eigenpairs(hvp, 6, k=3, iters=6).values, np.linalg.eigvalsh(h)[::-1][:3], rtol=1e-6)
    basis = np.eye(6)
    assert sum(basis[i] @ hvp(basis[i]) for i in range(6)) == pytest.approx(np.trace(h), rel=1e-10)


def test_logistic_regression_curvature_is_xt_diag_sigma_one_minus_sigma_x_over_n():
    rng = np.random.default_rng(5)
    x, y = torch.tensor(rng.standard_normal((80, 5))), torch.tensor(rng.integers(0, 2, 80), dtype=torch.float64)
    w0 = rng.standard_normal(5)
    hvp = autograd_hvp(lambda w: torch.nn.functional.binary_cross_entropy_with_logits(x @ w, y), w0)
    p = torch.sigmoid(x @ torch.tensor(w0)).numpy()
    h = (x.numpy().T * (p * (1 - p))) @ x.numpy() / 80
    np.testing.assert_allclose(top_eigenpairs(hvp, 5, k=2, iters=5).values, np.linalg.eigvalsh(h)[::-1][:2], rtol=1e-6)
    basis = np.eye(5)
    assert sum(basis[i] @ hvp(basis[i]) for i in range(5)) == pytest.approx(np.trace(h), rel=1e-10)


def test_a_tiny_networks_top_eigenvalues_and_trace_equal_its_full_hessians():
    torch.manual_seed(0)
    x, y = torch.randn(16, 3, dtype=torch.float64), torch.randn(16, dtype=torch.float64)

    def loss(w):  # a 3-4-1 tanh network, its 20 parameters as one vector
        hidden = torch.tanh(x @ w[:12].reshape(3, 4) + w[12:16])
        return ((hidden @ w[16:20] - y) ** 2).mean()

    w0 = torch.randn(20, dtype=torch.float64) * 0.5
    full = torch.autograd.functional.hessian(loss, w0).numpy()
    hvp = autograd_hvp(loss, w0.numpy())
    np.testing.assert_allclose(top_eigenpairs(hvp, 20, k=3, iters=20).values, np.linalg.eigvalsh(full)[::-1][:3],
                               rtol=1e-6)  # fmt: skip
    exact_trace = sum(np.eye(20)[i] @ hvp(np.eye(20)[i]) for i in range(20))
    assert exact_trace == pytest.approx(np.trace(full), rel=1e-10)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="1 <= k <= min"):
        top_eigenpairs(lambda v: v, 5, k=6)
    with pytest.raises(ValueError, match="probes must be at least 1"):
        hutchinson_trace(lambda v: v, 5, 0)


# --- the two-pass path: a basis over basis_bytes is not kept -------------------------------------------------------


def outliers_and_bulk(n=3000):
    """Three separated top eigenvalues over a bulk in [0, 1]: eig1 converges in a few steps, and without
    re-orthogonalisation its copies ('ghosts') crowd the Ritz values soon after."""
    return np.concatenate([[100.0, 50.0, 20.0], np.linspace(0.0, 1.0, n)])


def test_two_passes_find_the_dense_top_eigenpairs_where_ghosts_appear():
    d = outliers_and_bulk()
    kept = top_eigenpairs(lambda v: d * v, len(d), k=3, iters=60, tol=1e-6)
    two = top_eigenpairs(lambda v: d * v, len(d), k=3, iters=60, tol=1e-6, basis_bytes=0)
    np.testing.assert_allclose(two.values, [100.0, 50.0, 20.0], rtol=1e-10)
    np.testing.assert_allclose(two.values, kept.values, rtol=1e-10)
    assert two.converged.all() and two.vectors.dtype == np.float32
    assert 60 <= (two.products + 1) // 2 <= 120  # steps on spurious copies do not count, up to twice the steps
    for i in range(3):  # the unit eigenvectors e_0, e_1, e_2, to float32 rounding
        assert abs(two.vectors[i, i]) == pytest.approx(1.0, abs=1e-6)
        assert abs(float(two.vectors[:, i].astype(np.float64) @ kept.vectors[:, i])) == pytest.approx(1.0, abs=1e-6)


def test_two_passes_stop_early_where_the_kept_basis_does_with_the_same_values():
    h = np.diag(np.concatenate([[10.0, 7.0, 5.0], np.linspace(0.0, 1.0, 300)]))
    kept = top_eigenpairs(lambda v: h @ v, 303, k=3, iters=60, tol=1e-6, stop_early=True)
    two = top_eigenpairs(lambda v: h @ v, 303, k=3, iters=60, tol=1e-6, stop_early=True, basis_bytes=0)
    assert two.converged.all() and two.products == 2 * kept.products - 1  # no copy before convergence here
    np.testing.assert_allclose(two.values, kept.values, rtol=1e-9)
    np.testing.assert_allclose(np.abs(two.vectors), np.abs(kept.vectors), atol=1e-6)


def test_two_passes_on_a_tiny_networks_hessian_equal_its_full_hessians_top_eigenvalues():
    torch.manual_seed(0)
    x, y = torch.randn(16, 3, dtype=torch.float64), torch.randn(16, dtype=torch.float64)

    def loss(w):
        hidden = torch.tanh(x @ w[:12].reshape(3, 4) + w[12:16])
        return ((hidden @ w[16:20] - y) ** 2).mean()

    w0 = torch.randn(20, dtype=torch.float64) * 0.5
    full = np.linalg.eigh(torch.autograd.functional.hessian(loss, w0).numpy())
    two = top_eigenpairs(autograd_hvp(loss, w0.numpy()), 20, k=3, iters=20, basis_bytes=0)
    np.testing.assert_allclose(two.values, full.eigenvalues[::-1][:3], rtol=1e-6)
    assert two.converged.all()
    cosines = np.abs(two.vectors.astype(np.float64).T @ full.eigenvectors[:, ::-1][:, :3])
    np.testing.assert_allclose(np.diag(cosines), 1.0, atol=1e-5)


def test_memory_is_bounded_by_the_vector_not_the_steps():
    import tracemalloc

    d = outliers_and_bulk(50_000)
    vector = d.nbytes
    tracemalloc.start()
    top_eigenpairs(lambda v: d * v, len(d), k=3, iters=24, tol=1e-9, basis_bytes=0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # three float64 Lanczos vectors, a product and its temporaries, three float32 sums: under 8 vectors,
    # where the kept basis alone would be 24
    assert peak < 8 * vector


def test_two_passes_on_a_gpts_difference_products_equal_the_kept_basis_at_the_surface_settings():
    from tests.landscape.helpers import gpt_loss, params_of
    from topometrics.landscape.slice import difference_hvp
    from topometrics.landscape.surface import LANCZOS_TOL

    model, _, _, loss = gpt_loss()
    hvp, dim = difference_hvp(loss, params_of(model), one_sided=True)
    kept = top_eigenpairs(hvp, dim, 3, 20, 0, LANCZOS_TOL, stop_early=True)
    two = top_eigenpairs(hvp, dim, 3, 20, 0, LANCZOS_TOL, stop_early=True, basis_bytes=0)
    assert kept.converged.all() and two.converged.all()
    np.testing.assert_allclose(two.values, kept.values, rtol=1e-5)  # two orders below LANCZOS_TOL
    cosines = np.abs(np.sum(two.vectors.astype(np.float64) * kept.vectors, axis=0))
    np.testing.assert_allclose(cosines, 1.0, atol=1e-5)  # the hess slice's directions, up to sign


# --- float32 vectors, Ritz vectors in a file: a model too large for float64 copies ---------------------------------


def test_float32_two_passes_with_ritz_vectors_in_a_file_find_the_dense_top_eigenpairs(scratch):
    d = outliers_and_bulk()
    found = top_eigenpairs(
        read_in(lambda v: d * v), len(d), k=3, iters=60, tol=1e-5, basis_bytes=0, dtype=np.float32, spill=scratch
    )
    np.testing.assert_allclose(found.values, [100.0, 50.0, 20.0], rtol=1e-6)
    assert found.converged.all() and isinstance(found.vectors, FileRows)
    for i in range(3):  # the unit eigenvectors e_0, e_1, e_2, to float32 rounding
        vector = found.vector(i)
        assert vector.dtype == np.float32 and abs(vector[i]) == pytest.approx(1.0, abs=1e-5)


def test_ritz_vectors_summed_in_a_file_equal_those_summed_in_memory(scratch):
    h = np.diag(np.concatenate([[10.0, 7.0, 5.0], np.linspace(0.0, 1.0, 3000)]))
    d = np.diag(h)
    run = dict(k=3, iters=40, tol=1e-5, stop_early=True, basis_bytes=0, dtype=np.float32)
    in_memory = top_eigenpairs(lambda v: d * v, len(d), **run)
    in_file = top_eigenpairs(read_in(lambda v: d * v), len(d), **run, spill=scratch)
    assert np.array_equal(in_memory.values, in_file.values) and in_memory.products == in_file.products
    for i in range(3):
        np.testing.assert_allclose(in_file.vector(i), in_memory.vector(i), atol=1e-6)
    kept = top_eigenpairs(lambda v: h @ v, len(d), k=3, iters=40, tol=1e-5, stop_early=True)
    np.testing.assert_allclose(in_file.values, kept.values, rtol=1e-6)  # float32 vectors: float64's values


def test_float32_memory_is_the_products_result_when_the_lanczos_vectors_wait_in_files(scratch):
    import tracemalloc

    d = outliers_and_bulk(1 << 24).astype(np.float32)  # 64 MB a vector
    vector, step = d.nbytes, len(d) // 16

    def streamed(v):  # as slice.exact_hvp does: the vector in a file read a part at a time into the result
        out = np.empty(len(d), dtype=np.float32)
        for at in range(0, len(d), step):
            out[at : at + step] = d[at : at + step] * read_part(v, 0, at, at + step)
        return out

    run = dict(k=3, iters=12, tol=1e-9, basis_bytes=0, dtype=np.float32)
    tracemalloc.start()
    found = top_eigenpairs(streamed, len(d), **run, spill=scratch)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert np.array_equal(found.values, top_eigenpairs(lambda v: d * v, len(d), **run).values)
    # the product's result and a chunk or two (a 16 MB float32 chunk of a file, a 32 MB float64 chunk of the
    # start vector as it is drawn): under 1.75 float32 vectors, where holding the current and the previous
    # vector through the recurrence would be three
    assert peak < 1.75 * vector
