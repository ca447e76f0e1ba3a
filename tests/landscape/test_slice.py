"""topometrics.landscape.slice: filter normalisation, the loss grid against a plain loop and a closed
form, scale invariance behind a LayerNorm, and Hessian-vector products (exact and by central differences)
against autograd's full Hessian, the difference product against the exact one on a GPT, and the eigenvalues
and trace Lanczos and the probes draw from the difference product against the full Hessian's."""

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call

from tests.landscape.helpers import gpt_loss, params_of
from topometrics.landscape import slice as slice_module
from topometrics.landscape.curvature import top_eigenpairs
from topometrics.landscape.slice import (
    difference_hvp,
    difference_step,
    exact_hvp,
    filter_normalised,
    flat_hvp,
    functional_loss,
    loss_grid,
    random_direction,
)
from topometrics.landscape.vectors import file_rows, write_row
from topometrics.models.model import GPT, GPTConfig


def test_filter_normalisation_gives_each_row_its_weights_row_norm_and_vectors_nothing():
    torch.manual_seed(0)
    params = {"w": torch.randn(5, 3), "emb": torch.randn(4, 2, 3), "b": torch.randn(5)}
    d = random_direction(params, torch.Generator().manual_seed(1))
    for name in ("w", "emb"):
        rows = lambda t: t.reshape(t.shape[0], -1).norm(dim=1)  # noqa: E731
        torch.testing.assert_close(rows(d[name]), rows(params[name]))
    assert torch.equal(d["b"], torch.zeros(5))
    scaled = filter_normalised(d, {k: 10 * v for k, v in params.items()})
    torch.testing.assert_close(scaled["w"], 10 * d["w"])


def test_the_grid_of_a_quadratic_is_its_closed_form_and_the_centre_is_the_weights():
    target = torch.tensor([[1.0, -2.0], [0.5, 3.0]], dtype=torch.float64)
    params = {"w": torch.zeros(2, 2, dtype=torch.float64)}
    d1 = {"w": torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)}
    d2 = {"w": torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)}
    grid = loss_grid(lambda p: ((p["w"] - target) ** 2).sum(), params, d1, d2, radius=2.0, n=5, chunk=7)
    steps = np.linspace(-2, 2, 5)
    expected = [[float(((a * d1["w"] + b * d2["w"] - target) ** 2).sum()) for b in steps] for a in steps]
    np.testing.assert_allclose(grid, expected, rtol=1e-12)
    assert grid[2, 2] == pytest.approx(float((target**2).sum()))


def test_a_gpts_grid_equals_a_plain_loop_of_forward_passes():
    model, x, y, loss = gpt_loss()
    params = params_of(model)
    gen = torch.Generator().manual_seed(3)
    d1, d2 = random_direction(params, gen), random_direction(params, gen)
    grid = loss_grid(loss, params, d1, d2, radius=0.5, n=3, chunk=4)
    for i, a in enumerate(np.linspace(-0.5, 0.5, 3)):
        for j, b in enumerate(np.linspace(-0.5, 0.5, 3)):
            moved = {k: params[k] + a * d1[k] + b * d2[k] for k in params}
            logits = functional_call(model, moved, (x,))
            expected = nn.functional.cross_entropy(logits.reshape(-1, 16), y.reshape(-1))
            assert grid[i, j] == pytest.approx(float(expected), rel=1e-10)
    with torch.no_grad():
        assert grid[1, 1] == pytest.approx(float(model.loss(x, y)), rel=1e-12)


def test_a_slice_behind_a_layernorm_does_not_depend_on_the_weights_scale():
    torch.manual_seed(1)
    x, y = torch.randn(32, 4, dtype=torch.float64), torch.randn(32, 6, dtype=torch.float64)
    model = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6, eps=0.0, elementwise_affine=False)).double()
    loss = functional_loss(model, lambda call: ((call(x) - y) ** 2).mean())
    grids = []
    for scale in (1.0, 10.0):
        params = {k: scale * v for k, v in params_of(model).items()}
        gen = torch.Generator().manual_seed(5)  # the same raw directions
        d1, d2 = random_direction(params, gen), random_direction(params, gen)
        grids.append(loss_grid(loss, params, d1, d2, radius=1.0, n=5))
    np.testing.assert_allclose(grids[0], grids[1], rtol=1e-9)


def test_hessian_vector_products_equal_autograds_full_hessian():
    loss, params, full = tanh_network()
    hvp, dim = flat_hvp(loss, params)
    assert dim == 21
    for v in np.eye(dim)[:5]:
        np.testing.assert_allclose(hvp(v), full @ v, atol=1e-10)


def tanh_network():
    """A 3-4-1 tanh network's mean squared error (float64), its parameters and autograd's full Hessian."""
    torch.manual_seed(2)
    x, y = torch.randn(16, 3, dtype=torch.float64), torch.randn(16, 1, dtype=torch.float64)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)).double()
    loss = functional_loss(model, lambda call: ((call(x) - y) ** 2).mean())
    params = params_of(model)
    flat = torch.cat([p.reshape(-1) for p in params.values()])
    shapes = [(k, p.shape, p.numel()) for k, p in params.items()]

    def loss_of_flat(v):
        chunks, start = {}, 0
        for name, shape, size in shapes:
            chunks[name] = v[start : start + size].reshape(shape)
            start += size
        return loss(chunks)

    return loss, params, torch.autograd.functional.hessian(loss_of_flat, flat).numpy()


def test_difference_products_equal_autograds_full_hessian_and_scale_with_the_vector():
    loss, params, full = tanh_network()
    hvp, dim = difference_hvp(loss, params)
    rng = np.random.default_rng(0)
    for v in [*np.eye(dim)[:5], rng.standard_normal(dim), 1e3 * rng.standard_normal(dim)]:
        np.testing.assert_allclose(hvp(v), full @ v, atol=1e-8 * max(1.0, np.linalg.norm(v)))
    assert np.array_equal(hvp(np.zeros(dim)), np.zeros(dim))


def test_lanczos_and_the_trace_on_difference_products_equal_the_full_hessians():
    loss, params, full = tanh_network()
    hvp, dim = difference_hvp(loss, params)
    found = top_eigenpairs(hvp, dim, k=3, iters=dim, seed=0, tol=1e-6)
    np.testing.assert_allclose(found.values, np.linalg.eigvalsh(full)[::-1][:3], rtol=1e-7)
    trace = sum(e @ hvp(e) for e in np.eye(dim))
    assert trace == pytest.approx(np.trace(full), rel=1e-8)


def test_a_gpts_difference_products_equal_its_exact_products():
    model, _, _, loss = gpt_loss()
    params = params_of(model)
    exact, dim = flat_hvp(loss, params)
    approx, _ = difference_hvp(loss, params)
    rng = np.random.default_rng(1)
    for _ in range(3):
        v = rng.standard_normal(dim)
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):  # forward mode needs it
            expected = exact(v)
        got = approx(v)
        assert np.linalg.norm(got - expected) <= 1e-7 * np.linalg.norm(expected)


def test_one_sided_differences_equal_the_full_hessian_to_the_square_root_of_eps():
    loss, params, full = tanh_network()
    hvp, dim = difference_hvp(loss, params, one_sided=True)
    rng = np.random.default_rng(0)
    for v in [*np.eye(dim)[:5], rng.standard_normal(dim), 1e3 * rng.standard_normal(dim)]:
        np.testing.assert_allclose(hvp(v), full @ v, atol=1e-6 * max(1.0, np.linalg.norm(v)))
    assert np.array_equal(hvp(np.zeros(dim)), np.zeros(dim))
    found = top_eigenpairs(hvp, dim, k=3, iters=dim, seed=0, tol=1e-6)
    np.testing.assert_allclose(found.values, np.linalg.eigvalsh(full)[::-1][:3], rtol=1e-6)


def test_a_gpts_one_sided_difference_products_equal_its_exact_products():
    model, _, _, loss = gpt_loss()
    params = params_of(model)
    exact, dim = flat_hvp(loss, params)
    approx, _ = difference_hvp(loss, params, one_sided=True)
    rng = np.random.default_rng(1)
    for _ in range(3):
        v = rng.standard_normal(dim)
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            expected = exact(v)
        assert np.linalg.norm(approx(v) - expected) <= 1e-6 * np.linalg.norm(expected)


def test_the_difference_step_is_the_cube_root_of_eps_scaled_by_the_weights_norm():
    eps = np.finfo(np.float64).eps
    assert difference_step({"w": torch.zeros(3)}) == pytest.approx(np.cbrt(eps))
    assert difference_step({"w": torch.full((4,), 5.0), "b": torch.zeros(2)}) == pytest.approx(10 * np.cbrt(eps))
    assert difference_step({"w": torch.full((4,), 5.0)}, one_sided=True) == pytest.approx(10 * np.sqrt(eps))


def float32_gpt():
    """A tiny float32 GPT's loss on a 4-window batch: whole, per window, its params, and a float64 copy's exact
    product (forward-over-reverse) as the reference."""
    torch.manual_seed(3)
    model = GPT(GPTConfig(vocab_size=16, context=8, hidden=8, layers=2, heads=2))
    x = torch.randint(0, 16, (4, 8))
    y = torch.roll(x, -1, dims=1)

    def loss_on(model, xs, ys):
        cross_entropy = nn.functional.cross_entropy
        return functional_loss(model, lambda call: cross_entropy(call(xs).reshape(-1, 16), ys.reshape(-1)))

    windows = [loss_on(model, x[i : i + 1], y[i : i + 1]) for i in range(4)]
    double = GPT(model.cfg).double()
    double.load_state_dict(model.state_dict())
    reference, _ = flat_hvp(loss_on(double, x, y), params_of(double))
    return model, windows, loss_on(model, x, y), reference


def test_exact_float32_products_of_the_windows_equal_the_float64_exact_product_of_the_batch():
    model, windows, whole, reference = float32_gpt()
    params = {k: p.detach() for k, p in model.named_parameters()}
    by_window, dim = exact_hvp(windows, params)
    in_one, _ = exact_hvp([whole], params)
    rng = np.random.default_rng(4)
    for _ in range(3):
        v = rng.standard_normal(dim)
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            expected = reference(v)
        for hvp in (by_window, in_one):
            got = hvp(v.astype(np.float32))
            assert got.dtype == np.float32
            assert np.linalg.norm(got - expected) <= 1e-5 * np.linalg.norm(expected)  # float32 rounding, ~3e-7 here
    assert all(p.grad is None for p in model.parameters())  # the hooks leave no gradient behind


def test_an_exact_float32_product_reads_the_vector_in_place_and_is_linear():
    model, windows, _, _ = float32_gpt()
    hvp, dim = exact_hvp(windows, {k: p.detach() for k, p in model.named_parameters()})
    v = np.random.default_rng(5).standard_normal(dim).astype(np.float32)
    before = v.copy()
    product = hvp(v)
    assert np.array_equal(v, before)
    np.testing.assert_allclose(hvp(3 * v), 3 * product, rtol=1e-4, atol=1e-6 * np.abs(product).max())
    assert np.array_equal(hvp(np.zeros(dim, dtype=np.float32)), np.zeros(dim))


def test_a_gradient_dotted_with_its_share_keeps_no_share_and_differentiates_as_autograds_product_to_the_bit():
    import weakref

    torch.manual_seed(8)
    w, values = torch.randn(50, requires_grad=True), torch.randn(50)
    given = []

    def share():  # a fresh tensor each call, as a share read from a file is
        t = values.clone()
        given.append(weakref.ref(t))
        return t

    term = slice_module._DotWithShare.apply(torch.tanh(w) * 3, share)
    assert len(given) == 1 and given[0]() is None  # the forward's share is not kept for the backward
    (ours,) = torch.autograd.grad(term, w)
    (theirs,) = torch.autograd.grad((torch.tanh(w) * 3 * values).sum(), w)
    assert len(given) == 2 and torch.equal(ours, theirs) and term.item() == float((torch.tanh(w) * 3 * values).sum())


def test_an_exact_product_of_a_vector_in_a_file_is_the_product_of_the_vector_in_memory_bit_for_bit(scratch):
    model, windows, _, _ = float32_gpt()
    hvp, dim = exact_hvp(windows, {k: p.detach() for k, p in model.named_parameters()})
    v = np.random.default_rng(6).standard_normal(dim).astype(np.float32)
    in_file = file_rows(scratch, 1, dim)
    write_row(in_file, 0, v)
    assert np.array_equal(hvp(in_file), hvp(v))  # each parameter's share read as the first pass reaches it
    with pytest.raises(ValueError, match=f"one row of {dim} values, not 2 x {dim}"):
        hvp(file_rows(scratch, 2, dim))


def test_an_exact_product_hands_the_freed_heap_back_before_its_passes_and_after(monkeypatch):
    # before: what the loss grids' forward passes freed would sit under the product's peak (160M shape: the
    # slice curvature's peak 2,791 MiB, 2,523 with the heap handed back first); after: the product's own buffers
    model, windows, _, _ = float32_gpt()
    events = []
    monkeypatch.setattr(slice_module, "_return_freed_heap", lambda: events.append("trim"))

    def counted(loss):
        def call(params):
            events.append("pass")
            return loss(params)

        return call

    hvp, dim = exact_hvp([counted(w) for w in windows], {k: p.detach() for k, p in model.named_parameters()})
    hvp(np.ones(dim, dtype=np.float32))
    assert events == ["trim", *["pass"] * len(windows), "trim"]


@pytest.mark.parametrize("chunk", [1, 4])
def test_the_grids_coefficients_live_on_the_weights_device(chunk):
    # The meta device stands in for CUDA (no GPU here): like CUDA, it will not combine a CPU tensor of shape (1,)
    # or a vmapped CPU coefficient with its own tensors, only a 0-dim CPU scalar.
    params = {"w": torch.zeros(2, 3, device="meta"), "b": torch.zeros(3, device="meta")}
    d1 = {k: torch.ones_like(v) for k, v in params.items()}
    seen = []

    def loss(moved):
        seen.extend(v.device.type for v in moved.values())
        return torch.zeros(())  # a CPU number: the meta tensors hold no values to sum

    grid = loss_grid(loss, params, d1, d1, radius=1.0, n=3, chunk=chunk)
    assert grid.shape == (3, 3) and set(seen) == {"meta"}
