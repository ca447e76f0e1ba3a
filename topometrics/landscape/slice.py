"""A model's loss around its weights: filter-normalised directions, a 2-D loss grid, Hessian-vector products.

Any ``torch.nn.Module`` with a loss ``loss_fn(model_output_fn)``: the caller passes
``loss(params) -> scalar tensor`` built with ``torch.func.functional_call`` (:func:`functional_loss`),
so the same code serves our GPT and any Hugging Face decoder's forward pass.

**Directions** (Li et al. 2018, "Visualizing the loss landscape of neural nets", section 4): a
direction is a dict of tensors shaped like the parameters. Filter normalisation scales each *row*
(output unit) of a matrix-shaped parameter to the norm of the same row of the weights, so a slice
does not depend on the weights' scale (a layer followed by a normalisation is scale-invariant, and so
is its slice); 1-D parameters (biases, LayerNorm gains) get a zero direction, as in the paper.

**The grid**: ``n`` x ``n`` points ``theta + a d1 + b d2``, ``a, b`` in ``linspace(-radius, radius, n)``
(radius in units of the normalised directions); ``grid[i, j]`` is at ``(a_i, b_j)``, the weights
themselves at the centre when ``n`` is odd. Points are evaluated ``chunk`` at a time with
``torch.func.vmap`` over stacked parameter sets (one forward pass per chunk), or one by one when ``chunk``
is 1. The vmapped pass runs attention on PyTorch's math kernel: vmap has no batching rule for the fused
``scaled_dot_product_attention`` kernels and would loop over the points itself; the math kernel's
matrix products batch (``python -m bench features --surface``).

**Hessian-vector products**: :func:`flat_hvp` is exact (forward-over-reverse, ``torch.func``; attention
must then run on the math kernel, about 15-30 forward+backward passes per product on our models);
:func:`difference_hvp` takes central differences of two ordinary float64 gradients (fused kernels, about
4 forward+backward passes per product) with the step :func:`difference_step`, and agrees with the exact
product to about ``eps64^(2/3)`` relative (tests: 1e-7 on a GPT, 1e-8 absolute on a small network); with
``one_sided`` it takes forward differences from the gradient at the weights (computed once): one float64
gradient per product, half the cost, to about ``eps64^(1/2)`` relative (tests: 1e-5 on a GPT) — still two
orders below the Lanczos tolerance the curvature uses (1e-3).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch.func import functional_call, grad, jvp, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

from topometrics.landscape.vectors import FileRows, Vector, parts, read_part

Params = dict[str, torch.Tensor]
LossOfParams = Callable[[Params], torch.Tensor]


def functional_loss(model: torch.nn.Module, loss_of_model: Callable[..., torch.Tensor]) -> LossOfParams:
    """``params -> loss_of_model(call)``, where ``call(*inputs)`` runs ``model`` with ``params`` (functional)."""

    def loss(params: Params) -> torch.Tensor:
        return loss_of_model(lambda *inputs: functional_call(model, params, inputs))

    return loss


def random_direction(params: Params, generator: torch.Generator) -> Params:
    """A Gaussian direction drawn from ``generator`` in ``params``' order, filter-normalised."""
    raw = {name: torch.randn(p.shape, generator=generator, dtype=p.dtype).to(p.device) for name, p in params.items()}
    return filter_normalised(raw, params)


def filter_normalised(direction: Params, params: Params) -> Params:
    """``direction`` with each row of each matrix scaled to the norm of that row of ``params`` (1-D: zero).

    A row of the direction that is zero stays zero. Rows are the first axis (a linear layer's output
    units, an embedding's tokens); higher-rank parameters are normalised per slice of their first axis.
    """
    out = {}
    for name, d in direction.items():
        w = params[name].detach()
        if w.dim() < 2:
            out[name] = torch.zeros_like(w)
            continue
        d_rows, w_rows = d.reshape(d.shape[0], -1), w.reshape(w.shape[0], -1)
        d_norm = d_rows.norm(dim=1, keepdim=True)
        scale = torch.where(d_norm > 0, w_rows.norm(dim=1, keepdim=True) / d_norm.clamp_min(1e-30), 0.0)
        out[name] = (d_rows * scale).reshape(w.shape)
    return out


def loss_grid(loss: LossOfParams, params: Params, d1: Params, d2: Params, radius: float, n: int, chunk: int = 32):
    """``(n, n)`` float64 array of ``loss(theta + a d1 + b d2)`` on the grid; see the module docstring."""
    # On the weights' device: CUDA combines a CPU tensor with its own only when it is a 0-dim scalar, and
    # neither a (1,) slice of the loop nor vmap's batched coefficient is one.
    steps = torch.linspace(-radius, radius, n, dtype=torch.float64, device=next(iter(params.values())).device)
    a, b = (t.reshape(-1) for t in torch.meshgrid(steps, steps, indexing="ij"))
    base = {k: v.detach() for k, v in params.items()}

    def at(coeff_a: torch.Tensor, coeff_b: torch.Tensor) -> torch.Tensor:
        moved = {k: base[k] + coeff_a.to(base[k].dtype) * d1[k] + coeff_b.to(base[k].dtype) * d2[k] for k in base}
        return loss(moved)

    with torch.no_grad():
        if chunk == 1:  # a plain loop on the default (fused) attention kernels
            values = [at(a[i : i + 1], b[i : i + 1]).reshape(1) for i in range(len(a))]
        else:  # the math kernel batches under vmap; the fused ones would loop per point
            with sdpa_kernel(SDPBackend.MATH):
                values = [vmap(at)(a[i : i + chunk], b[i : i + chunk]) for i in range(0, len(a), chunk)]
    return torch.cat(values).double().reshape(n, n).cpu().numpy()


def flat_hvp(loss: LossOfParams, params: Params) -> tuple[Callable[[np.ndarray], np.ndarray], int]:
    """``(hvp, dim)``: ``v -> H v`` of ``loss`` at ``params`` on flat float64 vectors (forward-over-reverse).

    The flat order is ``params``' order, each tensor raveled in C order (:func:`unflatten` inverts it).
    """
    base = {k: v.detach() for k, v in params.items()}
    dim = sum(v.numel() for v in base.values())

    def hvp(v: np.ndarray) -> np.ndarray:
        tangent = unflatten(v, base)
        with sdpa_kernel(SDPBackend.MATH):  # the fused attention kernels have no forward-mode derivative on CUDA
            _, product = jvp(grad(loss), (base,), (tangent,))
        return torch.cat([product[k].reshape(-1) for k in base]).double().cpu().numpy()

    return hvp, dim


def difference_step(params: Params, one_sided: bool = False) -> float:
    """The difference step along a unit direction: ``h = eps64^(1/3) * max(1, ||theta||)`` for a central
    difference, ``eps64^(1/2) * max(1, ||theta||)`` for a one-sided one.

    The truncation error of a central difference is ``h^2/6`` times the third derivative, the rounding
    error about ``eps64 * |grad| / h``; ``h`` proportional to ``eps64^(1/3)`` (6e-6) balances them, so the
    product's relative error is of order ``eps64^(2/3)`` (4e-11) times the ratio of those derivatives to
    the curvature. A one-sided difference truncates at ``h/2`` times the third derivative, so its balance
    is at ``eps64^(1/2)`` (1.5e-8), with an error of that order. Scaling by the weights' norm keeps the step
    relative to where the weights are.
    """
    norm = float(torch.sqrt(sum((p.detach().double() ** 2).sum() for p in params.values())))
    eps = np.finfo(np.float64).eps
    return float(np.sqrt(eps) if one_sided else np.cbrt(eps)) * max(1.0, norm)


def difference_hvp(
    loss: LossOfParams, params: Params, one_sided: bool = False
) -> tuple[Callable[[np.ndarray], np.ndarray], int]:
    """``(hvp, dim)``: ``v -> H v`` by differences of float64 gradients, the flat order of :func:`flat_hvp`.

    ``H v = ||v|| (grad L(theta + h u) - grad L(theta - h u)) / (2 h)`` with ``u = v / ||v||`` and ``h`` from
    :func:`difference_step`: two ordinary backward passes in float64 (the weights are cast; the loss must
    accept float64 parameters, as ``functional_call`` does), on whatever attention kernel is the default.
    ``one_sided``: ``H v = ||v|| (grad L(theta + h u) - grad L(theta)) / h``, the gradient at ``theta`` taken
    once here, so one backward pass per product.
    """
    base = {k: v.detach().to(torch.float64) for k, v in params.items()}
    dim = sum(v.numel() for v in base.values())
    step = difference_step(base, one_sided)
    sizes = [p.numel() for p in base.values()]
    device = next(iter(base.values())).device

    def gradient(shift: Params, sign: float) -> torch.Tensor:
        leaves = {k: (base[k] + sign * shift[k]).requires_grad_(True) for k in base}
        grads = torch.autograd.grad(loss(leaves), list(leaves.values()), allow_unused=True)
        pairs = zip(grads, base.values(), strict=True)
        return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in pairs])

    def hvp(v: np.ndarray) -> np.ndarray:
        # torch.split views of one tensor: shifts built from numpy views (unflatten) made each product
        # about twice as slow (one thread, xl), though the arithmetic is the same
        flat = torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64))
        norm = float(flat.norm())
        if norm == 0.0:
            return np.zeros(dim)
        parts = torch.split(flat.to(device) * (step / norm), sizes)
        shift = {k: part.view_as(base[k]) for k, part in zip(base, parts, strict=True)}
        with torch.enable_grad():
            if one_sided:
                product = (gradient(shift, 1.0) - at_theta) * (norm / step)
            else:
                product = (gradient(shift, 1.0) - gradient(shift, -1.0)) * (norm / (2.0 * step))
        return product.cpu().numpy()

    if one_sided:
        with torch.enable_grad():
            at_theta = gradient(dict.fromkeys(base, 0.0), 0.0)
    return hvp, dim


def exact_hvp(losses: Sequence[LossOfParams], params: Params) -> tuple[Callable[[Vector], np.ndarray], int]:
    """``(hvp, dim)``: ``v -> H v`` exact in float32 (reverse-over-reverse), ``H`` the Hessian of the mean of
    ``losses`` (e.g. one per window of a batch) at ``params`` (float32), on flat float32 vectors in
    :func:`flat_hvp`'s order.

    For a model too large for float64 copies (:mod:`topometrics.landscape.curvature`'s float32 path): the
    product ``grad (grad L . v)`` is taken one loss at a time, so the activations of one window of the batch
    are held, not the batch's, and the gradients never exist whole: each parameter's gradient is dotted with
    ``v`` as the first backward pass reaches it and dropped, each part of ``H v`` is added into the result as
    the second pass produces it (``register_post_accumulate_grad_hook``). Memory: the model, ``v`` and the
    result (which ``v`` and the result may share with the caller: ``v`` is viewed, not copied), and the double
    backward's own working set for one window (its graphs and the engine's buffered per-layer gradients: 2.24
    vectors of the model's size at the 410M shape, ``tools/product_memory.py``); on a GPU, ``v`` and the result
    there too, the result copied back once per product. A ``v`` kept in a file (a one-row ``FileRows``) is read
    a parameter's share at a time as the first pass reaches that parameter, so the product holds the result and
    not ``v`` (the 410M shape's largest share, the embedding's, is 206 MB of its 1.2 GB). Attention runs on
    PyTorch's math kernel (the fused ones have no double backward). Agrees with the float64 products to about
    1e-6 relative (tests).
    """
    leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}  # views of the weights: no copy
    dim = sum(v.numel() for v in leaves.values())
    sizes = [p.numel() for p in leaves.values()]
    names = {id(p): k for k, p in leaves.items()}
    device = next(iter(leaves.values())).device
    starts = dict(zip(leaves, np.cumsum([0, *sizes[:-1]]).tolist(), strict=True))

    def hvp(v: Vector) -> np.ndarray:
        # what the loss grids' forward passes left on the heap would otherwise sit under this product's peak
        _return_freed_heap()
        tangent = _tangent(v, leaves, sizes, starts, device)
        out = np.zeros(dim, dtype=np.float32)
        # on a GPU the product is summed there and copied once: a copy per parameter and window waits each time
        into = torch.from_numpy(out) if device.type == "cpu" else torch.zeros(dim, device=device)
        pieces = torch.split(into, sizes)
        result = {k: t.view_as(p) for (k, p), t in zip(leaves.items(), pieces, strict=True)}
        terms: list[torch.Tensor] = []

        def dotted(p: torch.Tensor) -> None:  # first pass: grad . v, a parameter at a time
            terms.append(_DotWithShare.apply(p.grad, functools.partial(tangent, names[id(p)])))
            p.grad = None  # also breaks the cycle a create_graph gradient on a leaf makes

        def added(p: torch.Tensor) -> None:  # second pass: this loss's share of H v
            result[names[id(p)]].add_(p.grad, alpha=1.0 / len(losses))
            p.grad = None

        for loss in losses:
            with _hooked(leaves.values(), dotted):
                torch.autograd.backward(loss(leaves), inputs=list(leaves.values()), create_graph=True)
            with _hooked(leaves.values(), added):
                total = torch.stack(terms).sum()
                terms.clear()
                torch.autograd.backward(total, inputs=list(leaves.values()))
        if device.type != "cpu":
            out[:] = into.cpu().numpy()
        _return_freed_heap()
        return out

    return hvp, dim


class _DotWithShare(torch.autograd.Function):
    """``(g * share()).sum()``: a parameter's gradient ``g`` dotted with its share of the product's vector, the share
    asked for again in the backward instead of kept. Autograd's own product would keep every share it multiplied
    until the second pass, the whole vector, wherever the vector itself is kept (the 410M shape's landscape
    peaked at 7,231 MiB with its Lanczos vector in a file but kept by autograd). The same operations as
    ``(g * share).sum()`` under autograd, so the same values to the bit."""

    @staticmethod
    def forward(ctx, g: torch.Tensor, share: Callable[[], torch.Tensor]) -> torch.Tensor:
        ctx.share = share
        return (g * share()).sum()

    @staticmethod
    def backward(ctx, out: torch.Tensor):
        return out * ctx.share(), None


def _tangent(v: Vector, leaves: Params, sizes: list[int], starts: dict[str, int], device) -> Callable:
    """``name -> v``'s share for that parameter, shaped like it, on its device: viewed from ``v`` in memory (on a
    GPU, the vector goes there once), or on the CPU read from ``v``'s file each time it is asked for (once a window:
    page-cache reads, a few per cent of a product's time). On a GPU a vector in a file goes there once, a chunk
    at a time: the host holds a chunk, and the fast product does not wait for a read per window."""
    if isinstance(v, FileRows):
        if v.rows != 1 or v.dim != sum(sizes):
            raise ValueError(f"a product's vector in a file is one row of {sum(sizes)} values, not {v.rows} x {v.dim}")
        if device.type == "cpu":

            def read(name: str) -> torch.Tensor:
                share = read_part(v, 0, starts[name], starts[name] + leaves[name].numel())
                return torch.from_numpy(share).view_as(leaves[name])

            return read
        flat = torch.empty(v.dim, device=device)
        for start, part in parts(v):
            flat[start : start + len(part)] = torch.from_numpy(part).to(device)
    else:
        flat = torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)).to(device)
    viewed = {k: t.view_as(p) for (k, p), t in zip(leaves.items(), torch.split(flat, sizes), strict=True)}
    return viewed.__getitem__


def _return_freed_heap() -> None:
    """Give the C heap's freed memory back to the system (glibc's ``malloc_trim``; nothing elsewhere).

    A double backward frees many layer-sized buffers that glibc keeps on its heap; the next Lanczos vector is
    allocated elsewhere, so without this the kept heap and the vectors add up product after product (the peak
    crept by ~0.4 GB over 5 products on the 410M shape; trimmed, a 70M shape's process returns to within 25 MB
    of where it was before a product). Called before a product too: the loss grids' forward passes leave their
    own freed buffers, and the slice curvature's first product stood on them (its peak at the 160M shape,
    2,791 MiB, 2,523 with the heap handed back first)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


try:
    _LIBC = ctypes.CDLL("libc.so.6")
    _LIBC.malloc_trim  # noqa: B018 (glibc only)
except (OSError, AttributeError):
    _LIBC = None


@contextlib.contextmanager
def _hooked(leaves, hook):
    """``hook`` on every leaf after its gradient accumulates, gradients on, attention on the math kernel (the
    fused kernels have no double backward); torch's warning that a ``create_graph`` gradient on a leaf makes a
    reference cycle is silenced: the hooks drop every such gradient at once."""
    handles = [p.register_post_accumulate_grad_hook(hook) for p in leaves]
    try:
        with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Using backward\\(\\) with create_graph=True")
            yield
    finally:
        for handle in handles:
            handle.remove()


def unflatten(vector: np.ndarray, like: Params) -> Params:
    """A flat vector (C order, ``like``'s order) as tensors shaped and typed like ``like``."""
    out, start = {}, 0
    for name, p in like.items():
        out[name] = torch.as_tensor(vector[start : start + p.numel()], dtype=p.dtype, device=p.device).reshape(p.shape)
        start += p.numel()
    if start != len(vector):
        raise ValueError(f"a vector of {len(vector)} values for parameters of {start}")
    return out
