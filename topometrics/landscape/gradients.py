"""Per-example gradients of a model's loss as point clouds: their topology and their noise scale.

On a fixed batch of ``B`` examples (validation windows), each example's gradient of the loss is one
point per linear layer (the layer's weight gradient, ``B`` points in ``out x in`` dimensions) and one
point for the whole network (every linear layer's weight gradient, concatenated and sent through a
seeded Johnson-Lindenstrauss projection to ``k`` dimensions). Embeddings, biases and LayerNorm gains are
left out, as the weight features leave them out (the linear layers are the network's graph).

**Memory.** ``torch.func.vmap(grad)`` runs one layer at a time, differentiating only that layer's
weight (the rest held as constants), so at most ``B x`` the largest layer's gradient exists at once,
plus a ``(chunk, k)`` slice of the projection; per-example gradients of a whole model at once would
need ``B x`` the model. The price: one forward and backward pass of the batch per layer.

**Summaries.** Vietoris-Rips H0/H1 of each cloud (:mod:`topometrics.measures.persistence`), on the raw
gradients and on the gradients scaled to unit norm (directions only). The non-topological baseline:
the gradient-noise scale ``tr(Sigma) / |g_mean|^2`` (McCandlish et al. 2018, ``B_simple``; ``Sigma`` the
per-example covariance with the ``B - 1`` denominator) and the mean cosine between the examples'
gradients over all pairs. Both are exact for the whole network: ``tr(Sigma)``, ``|g_mean|^2`` and the
Gram matrix are sums over layers, accumulated in float64 (the projection is only for the cloud).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping

import numpy as np
import torch
from torch.func import functional_call, grad, vmap

from topometrics.measures.persistence import diagram_summary, vietoris_rips_diagrams

Params = dict[str, torch.Tensor]
ExampleLoss = Callable[[Params, torch.Tensor, torch.Tensor], torch.Tensor]
PROJECTION_CHUNK = 1 << 14  # projection rows drawn at a time: a (chunk, k) float32 slice (4 MB at k = 64)


def example_loss(model: torch.nn.Module) -> ExampleLoss:
    """``(params, x, y) -> mean next-token cross-entropy of one example``: ``x``, ``y`` (t,) token ids; the
    model maps (1, t) ids to (1, t, vocab) logits (or an output with ``.logits``, as Hugging Face's)."""

    def loss(params: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, params, (x[None],))
        logits = getattr(out, "logits", out)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    return loss


def layer_gradients(loss: ExampleLoss, params: Params, name: str, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """Per-example gradients of ``loss`` with respect to ``params[name]`` alone, over the batch ``x``, ``y``
    (B, t): a ``(B, numel)`` float32 array, row ``i`` the flattened gradient of example ``i``'s loss."""
    fixed = {k: v.detach() for k, v in params.items() if k != name}

    def one(weight: torch.Tensor, xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        return loss(fixed | {name: weight}, xi, yi)

    with warnings.catch_warnings():
        # torch.func has no batching rule for CPU attention kernels and says so once per call: it loops
        # over the examples instead, with the same values
        warnings.filterwarnings("ignore", message="There is a performance drop")
        g = vmap(grad(one), in_dims=(None, 0, 0))(params[name].detach(), x, y)
    return g.reshape(g.shape[0], -1).to("cpu", torch.float32).numpy()


def jl_projection_rows(rng: np.random.Generator, rows: int, k: int) -> np.ndarray:
    """The next ``rows`` rows of a Gaussian JL matrix with entries N(0, 1/k), float32 (rows, k), drawn from ``rng``.

    numpy draws normals one after another, so drawing a matrix in slices gives the same matrix as at once.
    """
    return (rng.standard_normal((rows, k), dtype=np.float32) / np.float32(np.sqrt(k))).astype(np.float32)


def jl_project(blocks: Iterable[np.ndarray], k: int, seed: int) -> np.ndarray:
    """``concat(blocks, axis=1) @ R`` (B, k) float64, with ``R`` the Gaussian JL matrix (N(0, 1/k) entries) of
    ``default_rng(seed)`` drawn row by row: blocks of any widths give the projection of their concatenation,
    and only a ``(PROJECTION_CHUNK, k)`` slice of ``R`` exists at a time."""
    rng, out = np.random.default_rng(seed), None
    for block in blocks:
        out = _project_block(np.asarray(block, dtype=np.float32), rng, k, out)
    if out is None:
        raise ValueError("no blocks to project")
    return out


def _project_block(block: np.ndarray, rng: np.random.Generator, k: int, out: np.ndarray | None) -> np.ndarray:
    out = np.zeros((block.shape[0], k)) if out is None else out
    for start in range(0, block.shape[1], PROJECTION_CHUNK):
        part = block[:, start : start + PROJECTION_CHUNK]
        out += part.astype(np.float64) @ jl_projection_rows(rng, part.shape[1], k).astype(np.float64)
    return out


def jl_tolerance(n_points: int, k: int, failure: float = 0.05) -> float:
    """The ``eps`` for which a Gaussian projection to ``k`` dimensions keeps every pairwise squared distance of
    ``n_points`` points within a factor ``1 +- eps`` with probability at least ``1 - failure`` (the union bound
    over pairs of the chi-square tail ``2 exp(-k (eps^2/2 - eps^3/3) / 2)``, Dasgupta and Gupta 2003); inf
    when no ``eps < 1`` reaches it."""
    pairs = n_points * (n_points - 1) / 2
    need = 2.0 * np.log(2.0 * pairs / failure) / k  # eps^2/2 - eps^3/3 must reach this
    grid = np.linspace(1e-4, 1.0, 100_000)
    ok = grid[grid**2 / 2 - grid**3 / 3 >= need]
    return float(ok[0]) if ok.size else float("inf")


class GradientMoments:
    """Sums over layers of what the noise scale and the cosine need: the (B, B) Gram matrix of the
    per-example gradients, in float64 (its diagonal the squared norms, its mean ``|g_mean|^2``)."""

    def __init__(self, batch: int) -> None:
        self.gram = np.zeros((batch, batch))

    def add(self, grads: np.ndarray) -> None:
        g = np.asarray(grads, dtype=np.float64)
        self.gram += g @ g.T


def noise_scale(gram: np.ndarray) -> float:
    """``tr(Sigma) / |g_mean|^2`` from the Gram matrix (B, B) of B per-example gradients (B >= 2): ``Sigma``'s
    trace is ``(sum |g_i|^2 - B |g_mean|^2) / (B - 1)``. 0 for identical gradients; NaN when the mean gradient is 0."""
    b = gram.shape[0]
    mean_sq = float(gram.sum()) / b**2
    trace = max(float(np.trace(gram)) - b * mean_sq, 0.0) / (b - 1)  # >= 0 up to rounding
    if mean_sq <= 0:
        return float("nan")
    return trace / mean_sq


def mean_cosine(gram: np.ndarray) -> float:
    """Mean cosine similarity over the ``B (B - 1) / 2`` pairs of gradients, from their Gram matrix (B, B);
    NaN when a gradient is zero (it has no direction)."""
    norms = np.sqrt(np.diag(gram))
    if not (norms > 0).all():
        return float("nan")
    cos = gram / np.outer(norms, norms)
    upper = np.triu_indices(gram.shape[0], k=1)
    return float(cos[upper].mean())


def unit_rows(points: np.ndarray) -> np.ndarray:
    """The rows of ``points`` (B, d) scaled to unit norm; zero rows (no direction) are dropped."""
    points = np.asarray(points, dtype=np.float64)
    norms = np.linalg.norm(points, axis=1)
    keep = norms > 0
    return points[keep] / norms[keep, None]


def cloud_summary(points: np.ndarray) -> dict[str, float]:
    """Vietoris-Rips summaries of a gradient cloud (B, d), raw and unit-normalised: the keys of
    :func:`topometrics.measures.persistence.diagram_summary`, the unit ones prefixed ``unit_`` (NaN when
    fewer than 2 gradients are non-zero, the unit sphere then having no pairs)."""
    raw = diagram_summary(vietoris_rips_diagrams(np.asarray(points, dtype=np.float64)))
    unit = unit_rows(points)
    if unit.shape[0] >= 2:
        unit_summary = diagram_summary(vietoris_rips_diagrams(unit))
    else:
        unit_summary = dict.fromkeys(raw, float("nan"))
    return raw | {f"unit_{key}": value for key, value in unit_summary.items()}


def gradient_topology(
    loss: ExampleLoss,
    params: Params,
    layers: Mapping[str, str],
    x: torch.Tensor,
    y: torch.Tensor,
    k: int,
    seed: int,
) -> dict[str, dict[str, float]]:
    """Gradient-cloud features per linear layer and for the whole network (``"all"``) on one fixed batch.

    Parameters
    ----------
    loss : ExampleLoss
        One example's loss as a function of the parameters (:func:`example_loss`).
    params : dict of tensors
        The model's parameters (e.g. ``dict(model.named_parameters())``), on the device the loss runs on.
    layers : mapping
        Layer name (``block0.attn.qkv``) -> the name of its weight in ``params``, in network order.
    x, y : (B, t) int64 tensors
        The fixed batch (B >= 2): inputs and next-token targets.
    k, seed : int
        The whole network's projection: ``k`` dimensions, ``default_rng(seed)`` (:func:`jl_project`).

    Returns
    -------
    ``{layer or "all": {tp0, tp1, entropy0, entropy1, count1, maxpers1, unit_* (the same), noise_scale,
    mean_cosine}}``. The per-layer clouds are exact; the ``"all"`` cloud is the projection, its noise
    scale and cosine exact (module docstring).
    """
    batch = x.shape[0]
    if batch < 2:
        raise ValueError(f"a gradient cloud needs at least 2 examples, got {batch}")
    rng, whole, total = np.random.default_rng(seed), None, GradientMoments(batch)
    out: dict[str, dict[str, float]] = {}
    for layer, name in layers.items():
        g = layer_gradients(loss, params, name, x, y)
        moments = GradientMoments(batch)
        moments.add(g)
        total.add(g)
        whole = _project_block(g, rng, k, whole)
        out[layer] = cloud_summary(g) | _baseline(moments.gram)
        del g  # the next layer's gradients replace these: one layer's (B, numel) at a time
    if whole is None:
        raise ValueError("no linear layers to take gradients of")
    out["all"] = cloud_summary(whole) | _baseline(total.gram)
    return out


def _baseline(gram: np.ndarray) -> dict[str, float]:
    return {"noise_scale": noise_scale(gram), "mean_cosine": mean_cosine(gram)}
