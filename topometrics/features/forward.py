"""The forward pass of one checkpoint on its fixed batches: what the forward-pass families measure.

:func:`model_on_batch` runs our GPT once forward and backward on the fixed validation batch
(:func:`validation_batch`) and returns a :class:`ForwardPass`: the residual stream after the last block,
each linear layer's weight-gradient norm, the loss (nats, and bits per byte), the loss of the parameters
on the loss-surface batch (:func:`surface_batch`, :func:`loss_surface`) and the per-example gradients'
batch. ``topometrics.series.checkpoint`` builds the same :class:`ForwardPass` for a Hugging Face decoder;
``topometrics.features.checkpoint`` turns either into feature rows. Nothing here touches files.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from topometrics.features.gradient_cloud import Clouds, GradientCloud, run_with_clouds, weight_names
from topometrics.landscape.slice import LossOfParams, Params, functional_loss
from topometrics.models.model import GPT, linear_modules
from topometrics.models.tokens import bits_per_byte
from topometrics.params import FeaturesParams


class LossSurface(NamedTuple):
    """The loss on the fixed loss-surface batch as a function of the parameters, and the weights."""

    loss: LossOfParams
    params: Params
    # the same loss as the mean of one per window of the batch: products that hold one window's activations
    windows: tuple[LossOfParams, ...] = ()


class ForwardPass(NamedTuple):
    """One forward/backward pass on the fixed batch."""

    states: np.ndarray  # (windows * context, hidden) float64: the residual stream after the last block
    grad_norms: dict[str, float]  # layer name -> Frobenius norm of d loss / d W (biases excluded)
    loss: float  # mean next-token cross-entropy on the batch (nats)
    surface: LossSurface | str = "no loss-surface batch"  # or why this checkpoint has none
    bpb: float = math.nan  # the same loss in bits per UTF-8 byte of the targets' text (NaN: bytes unknown)
    gradients: GradientCloud | str = "no gradient batch"  # per-example gradients' batch, or why there is none


class NoForwardPass(Exception):
    """The checkpoint's model cannot run; the message is the reason its forward features are NULL."""


def validation_batch(tokens: np.ndarray, context: int, windows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed batch: window i is ``tokens[i*context : (i+1)*context]``, targets shifted by one.

    Returns
    -------
    x, y : (windows, context) int64 tensors
    """
    needed = windows * context + 1
    if tokens.size < needed:
        raise ValueError(
            f"validation corpus has {tokens.size} tokens, the fixed batch needs {needed} "
            f"({windows} windows of {context} + 1); lower features.rep_batch"
        )
    flat = torch.from_numpy(np.asarray(tokens[:needed], dtype=np.int64))
    return flat[:-1].view(windows, context), flat[1:].view(windows, context)


def surface_batch(
    tokens: np.ndarray, context: int, params: FeaturesParams, index: int
) -> tuple[torch.Tensor, torch.Tensor] | str:
    """The fixed loss-surface batch of a run's ``index``-th checkpoint (the first ``features.landscape_batch``
    validation windows, the same for every checkpoint), or why that checkpoint has none."""
    if index % params.landscape_every:
        return f"not a loss-surface checkpoint (features.landscape_every = {params.landscape_every})"
    needed = params.landscape_batch * context + 1
    if np.asarray(tokens).size < needed:
        return (
            f"features.landscape_batch = {params.landscape_batch} windows of {context} need {needed} validation "
            f"tokens, the split has {np.asarray(tokens).size}"
        )
    return validation_batch(tokens, context, params.landscape_batch)


def loss_surface(
    model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor] | str, logits=None
) -> LossSurface | str:
    """The mean next-token cross-entropy on ``batch`` as a function of ``model``'s parameters (or the reason
    ``batch`` is). ``logits``: model output -> logits (default: the output itself)."""
    if isinstance(batch, str):
        return batch
    x, y = batch
    as_logits = logits or (lambda out: out)

    def cross_entropy(inputs: torch.Tensor, targets: torch.Tensor):
        def of(call) -> torch.Tensor:
            out = as_logits(call(inputs))
            return torch.nn.functional.cross_entropy(out.reshape(-1, out.size(-1)), targets.reshape(-1))

        return of

    params = {name: p.detach() for name, p in model.named_parameters()}
    # every window has the same number of targets, so the batch's mean is the mean of the windows' means
    windows = tuple(functional_loss(model, cross_entropy(x[i : i + 1], y[i : i + 1])) for i in range(len(x)))
    return LossSurface(functional_loss(model, cross_entropy(x, y)), params, windows)


def model_on_batch(
    model: GPT,
    x: torch.Tensor,
    y: torch.Tensor,
    surface: tuple[torch.Tensor, torch.Tensor] | str = "no batch",
    n_bytes: float | None = None,
    gradients: tuple[torch.Tensor, torch.Tensor] | str = "no gradient batch",
    clouds: Clouds | None = None,
) -> ForwardPass:
    """Hidden states after the last block, per-layer weight-gradient norms and the batch loss (also in bits per
    byte when ``n_bytes``, the UTF-8 bytes the targets ``y`` stand for, is given); the loss of the
    parameters on the loss-surface batch ``surface`` and the per-example gradients' batch ``gradients``
    (:func:`topometrics.features.gradient_cloud.gradient_batch`), or the reasons they are ones. ``clouds``
    (:func:`~topometrics.features.gradient_cloud.clouds_of`; None: the family is off): when ``gradients`` is
    this batch, the family's values come from this one pass
    (:func:`~topometrics.features.gradient_cloud.run_with_clouds`).
    """
    modules = linear_modules(model)
    names = weight_names(model, modules)
    done = {}

    def run() -> None:
        model.zero_grad(set_to_none=True)
        loss, states = model.loss_and_states(x, y)  # the states from the same forward pass as the loss
        loss.backward()
        done.update(loss=loss.item(), states=states.detach())
        done["grads"] = {name: float(module.weight.grad.norm()) for name, module in modules.items()}
        model.zero_grad(set_to_none=True)

    cloud = run_with_clouds(model, names, (x, y), gradients, clouds, run)
    flat = done["states"].reshape(-1, done["states"].shape[-1]).double().cpu().numpy()
    bpb = bits_per_byte(done["loss"], y.numel(), n_bytes)
    surface_loss = loss_surface(model, surface)
    return ForwardPass(flat, done["grads"], done["loss"], surface=surface_loss, bpb=bpb, gradients=cloud)


def on_device(batch: tuple[torch.Tensor, ...] | str, device: torch.device) -> tuple[torch.Tensor, ...] | str:
    """A batch's tensors on ``device`` (the model's: ``features.device``); a reason (str) passes through."""
    return batch if isinstance(batch, str) else tuple(t.to(device) for t in batch)
