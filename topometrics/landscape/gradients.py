"""Per-example gradients of a model's loss as point clouds: their topology and their noise scale.

On a fixed batch of ``B`` examples (validation windows), each example's gradient of the loss is one
point per linear layer (the layer's weight gradient, ``B`` points in ``out x in`` dimensions) and one
point for the whole network (every linear layer's weight gradient, concatenated and sent through a
seeded Johnson-Lindenstrauss projection to ``k`` dimensions). Embeddings, biases and LayerNorm gains are
left out, as the weight features leave them out (the linear layers are the network's graph).

**Cost and memory.** An ``nn.Linear`` layer's per-example gradients come from one forward and backward
pass of the whole batch (:func:`linear_example_gradients`: example ``i``'s gradient is its output
gradients times its inputs, summed over its tokens). Each layer is summarised as the backward pass
reaches it, from blocks of its per-example gradients computed as they are read (:func:`linear_chunks`: one
batched matrix product of whole output rows a block, read once; the distances come from the Gram matrix,
:func:`topometrics.landscape.clouds.cloud_geometry`), so no layer's ``B x numel`` gradients exist whole: the
family holds one float32 block and one float64 piece of it, each at most 1/16 of the layer's gradients in values
(:mod:`topometrics.landscape.clouds`' ``block_values``, ``chunk_values``), and the projection's indices for at
most a quarter of their float32 size
(:func:`projection_columns`): a layer's own memory is a fraction of ``B x`` the layer, however small. Any
other layer (GPT-2's ``Conv1D``, a weight tied to another name) goes through ``torch.func.vmap(grad)`` one
layer at a time, differentiating only that layer's weight (the rest held as constants): ``B x`` that layer
at a time, at one forward and backward pass per layer. Per-example
gradients of a whole model at once would need ``B x`` the model.

**Summaries** (:mod:`topometrics.landscape.clouds`). Vietoris-Rips H0/H1 of each cloud, on the raw
gradients and on the gradients scaled to unit norm (directions only). The non-topological baseline:
the gradient-noise scale ``tr(Sigma) / |g_mean|^2`` (McCandlish et al. 2018, ``B_simple``; ``Sigma`` the
per-example covariance with the ``B - 1`` denominator) and the mean cosine between the examples'
gradients over all pairs. Both are exact for the whole network: ``tr(Sigma)``, ``|g_mean|^2`` and the
Gram matrix are sums over layers, accumulated in float64 (the projection is only for the cloud).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping

import numpy as np
import torch
from torch.func import functional_call, grad, vmap

from topometrics.landscape.clouds import (
    Chunks,
    block_values,
    cloud_geometry,
    cloud_summary,
    column_chunks,
    distance_summary,
    mean_cosine,
    noise_scale,
)
from topometrics.measures.projection import CHUNK, project, workspace_bytes

Params = dict[str, torch.Tensor]
ExampleLoss = Callable[[Params, torch.Tensor, torch.Tensor], torch.Tensor]


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


def jl_project(blocks: Iterable[np.ndarray], k: int, seed: int) -> np.ndarray:
    """``concat(blocks, axis=1) @ P`` (B, k) float64, ``P`` the package's sparse JL matrix of ``seed``
    (:func:`topometrics.measures.projection.project`): blocks of any widths give the projection of their
    concatenation, each block's columns projected at their offset in it."""
    out, offset = None, 0
    for block in blocks:
        block = np.asarray(block)
        out = project(block, k, seed, offset, out)
        offset += block.shape[1]
    if out is None:
        raise ValueError("no blocks to project")
    return out


def jl_tolerance(n_points: int, k: int, failure: float = 0.05) -> float:
    """The ``eps`` for which a Gaussian projection to ``k`` dimensions keeps every pairwise squared distance of
    ``n_points`` points within a factor ``1 +- eps`` with probability at least ``1 - failure`` (the union bound
    over pairs of the chi-square tail ``2 exp(-k (eps^2/2 - eps^3/3) / 2)``, Dasgupta and Gupta 2003); inf
    when no ``eps < 1`` reaches it. The package's sparse projection has at most the Gaussian's variance and,
    on vectors spread over many coordinates, its distribution (:mod:`topometrics.measures.projection`); the
    bound is checked on it by simulation, not proved for it."""
    pairs = n_points * (n_points - 1) / 2
    need = 2.0 * np.log(2.0 * pairs / failure) / k  # eps^2/2 - eps^3/3 must reach this
    grid = np.linspace(1e-4, 1.0, 100_000)
    ok = grid[grid**2 / 2 - grid**3 / 3 >= need]
    return float(ok[0]) if ok.size else float("inf")


def projection_columns(batch: int, numel: int, k: int) -> int:
    """Coordinates projected at a time (:func:`topometrics.measures.projection.project`'s ``chunk``) for a
    ``(batch, numel)`` cloud: its :data:`~topometrics.measures.projection.CHUNK`, or fewer so their index
    workspace (:func:`~topometrics.measures.projection.workspace_bytes` each) stays within ``batch x numel``
    bytes, a quarter of the cloud in float32 (with a small batch, a chunk's indices outweigh its values)."""
    return max(1, min(CHUNK, batch * numel // workspace_bytes(k)))


def linear_example_gradients(
    model: torch.nn.Module,
    modules: Mapping[str, torch.nn.Linear],
    x: torch.Tensor,
    y: torch.Tensor,
    each: Callable[[str, Chunks], None],
) -> None:
    """Per-example weight gradients of the ``nn.Linear`` layers ``modules`` (layer name -> module of ``model``)
    from ONE forward and backward pass of the batch ``x``, ``y`` (B, t).

    Each example's loss (mean next-token cross-entropy over its ``t`` tokens, as :func:`example_loss`) depends
    on its own row of every activation only, so the backward pass of their sum hands each linear layer its
    output gradients ``G`` (B, t, out) per example, and example ``i``'s weight gradient is ``G_i^T A_i``
    (``A`` the layer's input, (B, t, in), which autograd keeps for the pass anyway). ``each(layer, chunks)``
    is called as the backward pass reaches the layer (reverse network order): ``chunks()`` yields the
    per-example gradients (B, out * in) as column chunks (:func:`linear_chunks`), computed as they are
    read, so not even one layer's per-example gradients exist whole.

    When every layer has a bias, the pass differentiates for the biases only: each layer's output lies on
    the way to its own bias, so every layer is reached, and the weights' batch gradients are neither
    computed nor stored (the model's ``.grad`` are left as they were). Otherwise it is a whole backward pass,
    its ``.grad`` cleared after.
    """
    biases = [m.bias for m in modules.values() if m.bias is not None and m.bias.requires_grad]
    to_biases = bool(biases) and len(biases) == len(modules)
    try:
        with example_gradient_hooks(modules, each):
            out = model(x)
            logits = getattr(out, "logits", out)
            per_token = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none"
            )
            total = per_token.view(x.shape[0], -1).mean(dim=1).sum()
            if to_biases:
                torch.autograd.grad(total, biases)
            else:
                total.backward()
    finally:
        if not to_biases:
            model.zero_grad(set_to_none=True)


@contextlib.contextmanager
def example_gradient_hooks(
    modules: Mapping[str, torch.nn.Linear], each: Callable[[str, Chunks], None], scale: float = 1.0
) -> Iterator[None]:
    """Within the block, a backward pass through any forward pass of the ``nn.Linear`` layers ``modules`` (layer
    name -> module) calls ``each(layer, chunks)`` as it reaches each layer, with the per-example weight gradients
    of the loss it differentiates (:func:`linear_chunks`), times ``scale``: 1 for a loss that sums the examples'
    mean losses (:func:`linear_example_gradients`), ``B`` for the batch's mean over its ``B`` equal windows'
    tokens (whose gradient is each example's ``1 / B``)."""
    handles = []

    def capture(layer: str):
        def forward_hook(module, inputs, output):
            a = inputs[0].detach()

            def on_grad(g: torch.Tensor) -> None:
                each(layer, linear_chunks(g.detach() * scale if scale != 1.0 else g.detach(), a))

            output.register_hook(on_grad)

        return forward_hook

    try:
        for layer, module in modules.items():
            handles.append(module.register_forward_hook(capture(layer)))
        yield
    finally:
        for handle in handles:
            handle.remove()


def linear_chunks(g: torch.Tensor, a: torch.Tensor) -> Chunks:
    """Per-example weight gradients of an ``nn.Linear`` from its output gradients ``g`` (B, ..., out) and inputs
    ``a`` (B, ..., in): example ``i``'s flattened ``(out, in)`` gradient ``sum_t g_it a_it^T``, as column chunks
    of whole output rows, each one batched matrix product of about ``clouds.block_values`` values computed when
    read (float32 on the CPU, float64 when ``g`` is)."""
    batch, out, inputs = g.shape[0], g.shape[-1], a.shape[-1]
    outputs, a = g.reshape(batch, -1, out).transpose(1, 2), a.reshape(batch, -1, inputs)  # (B, out, t), (B, t, in)
    rows = max(1, block_values(batch, out * inputs) // (batch * inputs))
    dtype = torch.float64 if g.dtype == torch.float64 else torch.float32

    def chunks() -> Iterator[np.ndarray]:
        for start in range(0, out, rows):
            part = torch.bmm(outputs[:, start : start + rows], a)
            yield part.reshape(batch, -1).to("cpu", dtype).numpy()

    return chunks


def hookable_layers(model: torch.nn.Module | None, layers: Mapping[str, str]) -> dict[str, torch.nn.Linear]:
    """The layers of ``layers`` (layer -> weight name) whose weight is an ``nn.Linear``'s own, used by that module
    only (not tied to another parameter name): those :func:`linear_example_gradients` serves."""
    if model is None:
        return {}
    uses: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        uses[id(p)] = uses.get(id(p), 0) + 1
    found = {}
    for layer, name in layers.items():
        owner, _, leaf = name.rpartition(".")
        module = model.get_submodule(owner) if leaf == "weight" else None
        if isinstance(module, torch.nn.Linear) and uses.get(id(module.weight)) == 1:
            found[layer] = module
    return found


class _Clouds:
    """The clouds' summaries as layers' per-example gradients arrive (in any order): each layer's own, and the
    sums over layers the whole network needs (its projection, its Gram matrix)."""

    def __init__(self, layers: Mapping[str, str], sizes: Mapping[str, int], batch: int, k: int, seed: int) -> None:
        starts = np.cumsum([0, *(sizes[layer] for layer in layers)])
        self.offset = {layer: int(start) for layer, start in zip(layers, starts, strict=False)}
        self.sizes = sizes  # layer -> its weight's numel
        self.k, self.seed = k, seed
        self.whole, self.gram = np.zeros((batch, k)), np.zeros((batch, batch))
        self.out: dict[str, dict[str, float]] = {}

    def add(self, layer: str, chunks: Chunks) -> None:
        """Layer ``layer``'s per-example gradients (B, numel), as column chunks."""
        # the layer's coordinates are rows offset .. offset + numel - 1 of the whole network's matrix (layers
        # concatenated in network order), whatever order the layers arrive in: each chunk at its own offset
        at = [self.offset[layer]]
        columns = projection_columns(self.whole.shape[0], self.sizes[layer], self.k)

        def to_whole(part: np.ndarray) -> None:
            project(part, self.k, self.seed, at[0], self.whole, columns)
            at[0] += part.shape[1]

        gram, raw, unit = cloud_geometry(chunks, self.whole.shape[0], self.sizes[layer], to_whole)
        self.gram += gram
        self.out[layer] = distance_summary(raw, unit) | _baseline(gram)


def gradient_topology(
    loss: ExampleLoss,
    params: Params,
    layers: Mapping[str, str],
    x: torch.Tensor,
    y: torch.Tensor,
    k: int,
    seed: int,
    model: torch.nn.Module | None = None,
    around: Callable[[str], contextlib.AbstractContextManager] | None = None,
    run_pass: Callable[[Callable[[float], contextlib.AbstractContextManager]], None] | None = None,
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
        The whole network's projection: ``k`` dimensions, the sparse JL matrix of ``seed``
        (:func:`topometrics.measures.projection.project`) over the layers' weights concatenated in ``layers``
        order.
    model : module, optional
        The module ``loss`` calls: its ``nn.Linear`` layers (:func:`hookable_layers`) get their per-example
        gradients from one forward and backward pass (:func:`linear_example_gradients`); the others (and all,
        without a model) from ``torch.func`` one layer at a time (:func:`layer_gradients`). Both give the same
        gradients.
    around : callable, optional
        ``around(layer)``: a context manager each layer's per-example gradients and summaries are computed
        inside, one layer at a time (e.g. to measure a layer's memory); nothing else runs inside it.
    run_pass : callable, optional
        ``run_pass(hooks)`` runs someone else's forward and backward pass of ``model`` on ``x``, ``y`` inside
        ``with hooks(scale):`` (:func:`example_gradient_hooks`), instead of the family's own pass: e.g. the
        forward features' pass of the batch's mean loss (``scale`` = B), so one pass serves both. Called once,
        whether or not any layer is hookable.

    Returns
    -------
    ``{layer or "all": {tp0, tp1, entropy0, entropy1, count1, maxpers1, unit_* (the same), noise_scale,
    mean_cosine}}`` in ``layers`` order. The per-layer clouds are exact; the ``"all"`` cloud is the
    projection, its noise scale and cosine exact (module docstring).
    """
    batch = x.shape[0]
    if batch < 2:
        raise ValueError(f"a gradient cloud needs at least 2 examples, got {batch}")
    if not layers:
        raise ValueError("no linear layers to take gradients of")
    clouds = _Clouds(layers, {layer: params[name].numel() for layer, name in layers.items()}, batch, k, seed)
    around = around or (lambda layer: contextlib.nullcontext())

    def add(layer: str, chunks: Chunks) -> None:
        with around(layer):
            clouds.add(layer, chunks)  # the chunks are computed here, as they are read

    hooked = hookable_layers(model, layers)
    if run_pass is not None:
        run_pass(lambda scale: example_gradient_hooks(hooked, add, scale))
    elif hooked:
        linear_example_gradients(model, hooked, x, y, add)
    for layer, name in layers.items():
        if layer not in hooked:
            with around(layer):
                g = layer_gradients(loss, params, name, x, y)
                clouds.add(layer, lambda g=g: column_chunks(g))
                del g  # one layer's (B, numel) at a time
    out = {layer: clouds.out[layer] for layer in layers}
    out["all"] = cloud_summary(clouds.whole) | _baseline(clouds.gram)
    return out


def _baseline(gram: np.ndarray) -> dict[str, float]:
    return {"noise_scale": noise_scale(gram), "mean_cosine": mean_cosine(gram)}
