"""The ``gradient_topology`` rows of one checkpoint: per-example gradients on a fixed batch as point clouds.

The computation is :func:`topometrics.landscape.gradients.gradient_topology` (one layer's per-example
weight gradients at a time, the whole network through a seeded JL projection); this module fixes its
batch (the first ``features.grad_batch`` validation windows, the same for every checkpoint of a run or
series), names its values in the vocabulary's ``gt_`` names and turns every way it cannot run into NULL
rows with the reason. Both forward passes (``topometrics.features.forward.model_on_batch`` and
``topometrics.series.checkpoint.causal_lm_on_batch``) hand it a :class:`GradientCloud`, through
:func:`run_with_clouds`: when the clouds' batch is the forward pass's own, one forward and backward pass serves both.

Rows: per linear layer ``gt_<summary>`` and ``gt_unit_<summary>`` (their ``layer='all'`` rows by the
declared aggregation); for ``layer='all'`` also ``gt_net_*`` (the whole network's projected cloud) and the
family's non-topological baseline ``gt_noise_scale``, ``gt_mean_cosine`` (exact, over all linear layers).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np
import torch

from topometrics.landscape.gradients import ExampleLoss, Params, example_loss, gradient_topology
from topometrics.measures.layer_features import aggregate_layers
from topometrics.params import FeaturesParams
from topometrics.vocabulary import ALL, GRADIENT_TOPOLOGY, model_only, per_layer

Row = tuple[str, dict[str, float], str | None]  # layer, {feature: value}, reason
_BASELINE = ("noise_scale", "mean_cosine")


class GradientCloud(NamedTuple):
    """What :func:`gradient_rows` needs of a model: one example's loss of the parameters, the parameters, the
    linear layers (name -> the name of their weight in ``params``, network order), the batch (B, t) and the
    model itself (its ``nn.Linear`` layers' gradients then come from one batched pass); or, in ``found``, the
    family's values already computed inside the forward features' own pass (:func:`run_with_clouds`)."""

    loss: ExampleLoss
    params: Params
    layers: Mapping[str, str]
    x: torch.Tensor
    y: torch.Tensor
    model: torch.nn.Module | None = None
    found: dict[str, dict[str, float]] | None = None


Clouds = tuple[int, int]  # the whole network's projection: (features.grad_dim, features.seed)


def clouds_of(params: FeaturesParams) -> Clouds | None:
    """The projection :func:`run_with_clouds` needs, or None when the family is switched off."""
    return (params.grad_dim, params.seed) if GRADIENT_TOPOLOGY.name in params.families else None


def run_with_clouds(
    model: torch.nn.Module,
    layers: Mapping[str, str],
    batch: tuple[torch.Tensor, torch.Tensor],
    gradients: tuple[torch.Tensor, torch.Tensor] | str,
    clouds: Clouds | None,
    run: Callable[[], None],
) -> GradientCloud | str:
    """Runs ``run()``, the forward features' pass on ``batch`` (forward, then backward of the batch's mean loss;
    ``model``'s ``.grad`` its to clear), and returns the family's :class:`GradientCloud` (or the reason there is
    none) for the clouds' batch ``gradients``; ``layers``: linear layer -> its weight's name.

    When ``gradients`` is ``batch`` (the defaults: ``features.grad_batch`` = ``features.rep_batch`` windows, both the
    validation split's first) and the family is on (``clouds``, :func:`clouds_of`), ``run()`` carries the
    per-example hooks (:func:`~topometrics.landscape.gradients.gradient_topology`'s ``run_pass``), so one forward
    and backward pass serves both, and the cloud comes back with its values in ``found``. Otherwise the cloud is
    :func:`gradient_cloud`'s, its own pass to come; so is it when the shared pass fails (the model has no batched
    rule), ``run()`` then run again if it had not finished.
    """
    if clouds is not None and not isinstance(gradients, str) and _same(gradients, batch):
        cloud, ran = gradient_cloud(model, layers, batch), []

        def run_pass(hooks) -> None:
            # the mean over B equal windows: each example's gradient is B x its part of the mean's
            with hooks(float(cloud.x.shape[0])):
                run()
            ran.append(True)

        try:
            found = gradient_topology(
                cloud.loss, cloud.params, cloud.layers, cloud.x, cloud.y, *clouds, model, run_pass=run_pass
            )
            return cloud._replace(found=found)
        except RuntimeError as err:
            model.zero_grad(set_to_none=True)
            if not ran:
                run()
            return no_batched_rule(err)
    run()
    return gradient_cloud(model, layers, gradients)


def no_batched_rule(err: RuntimeError) -> str:
    """The family's NULL reason when the model has no batched per-example gradient rule (one line)."""
    return f"per-example gradients not computable on this model: {err}".splitlines()[0]


def _same(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> bool:
    return all(p.shape == q.shape and bool(torch.equal(p, q)) for p, q in zip(a, b, strict=True))


def gradient_batch(tokens: np.ndarray, context: int, params: FeaturesParams) -> tuple[torch.Tensor, torch.Tensor] | str:
    """The first ``features.grad_batch`` validation windows of ``context`` tokens (inputs, next-token targets,
    (B, context) int64), or why there are none (the split is too short)."""
    needed = params.grad_batch * context + 1
    tokens = np.asarray(tokens)
    if tokens.size < needed:
        return (
            f"features.grad_batch = {params.grad_batch} windows of {context} need {needed} validation tokens, "
            f"the split has {tokens.size}"
        )
    flat = torch.from_numpy(np.asarray(tokens[:needed], dtype=np.int64))
    return flat[:-1].view(params.grad_batch, context), flat[1:].view(params.grad_batch, context)


def gradient_cloud(
    model: torch.nn.Module, layers: Mapping[str, str], batch: tuple[torch.Tensor, torch.Tensor] | str
) -> GradientCloud | str:
    """``model``'s :class:`GradientCloud` on ``batch`` (or the reason ``batch`` is); ``layers``: linear layer
    name -> its weight's name among ``model.named_parameters()``."""
    if isinstance(batch, str):
        return batch
    params = {name: p.detach() for name, p in model.named_parameters()}
    return GradientCloud(example_loss(model), params, dict(layers), *batch, model)


def weight_names(model: torch.nn.Module, modules: Mapping[str, torch.nn.Module]) -> dict[str, str]:
    """Layer name -> the parameter name of its module's ``weight`` (``modules``: layer name -> linear module)."""
    name_of = {id(p): name for name, p in model.named_parameters()}
    return {layer: name_of[id(module.weight)] for layer, module in modules.items()}


def gradient_rows(cloud: GradientCloud | str, layers: list[str], params: FeaturesParams) -> list[Row]:
    """The family's rows for linear layers ``layers`` and ``'all'``; all NULL with the reason when ``cloud`` is
    one, when the family is switched off, or when the model has no batched gradient rule."""
    if GRADIENT_TOPOLOGY.name not in params.families:
        cloud = "off"  # switched_off writes the reason
    if not isinstance(cloud, str):
        try:
            found = cloud.found
            if found is None:
                found = gradient_topology(
                    cloud.loss, cloud.params, cloud.layers, cloud.x, cloud.y, params.grad_dim, params.seed, cloud.model
                )
        except RuntimeError as err:
            cloud = no_batched_rule(err)
    if isinstance(cloud, str):
        rows: list[Row] = [(layer, dict.fromkeys(per_layer(GRADIENT_TOPOLOGY), np.nan), cloud) for layer in layers]
        names = per_layer(GRADIENT_TOPOLOGY) + model_only(GRADIENT_TOPOLOGY)
        return [*rows, (ALL, dict.fromkeys(names, np.nan), cloud)]
    values = {layer: _named(found[layer], "gt_") for layer in cloud.layers}
    rows = [(layer, v, None) for layer, v in values.items()]
    whole = found[ALL]
    model_rows = _named(whole, "gt_net_") | {f"gt_{key}": whole[key] for key in _BASELINE}
    return [*rows, (ALL, aggregate_layers(values) | model_rows, None)]


def _named(values: dict[str, float], prefix: str) -> dict[str, float]:
    """A cloud's topological summaries (its baseline left out) under ``prefix``."""
    return {prefix + key: value for key, value in values.items() if key not in _BASELINE}
