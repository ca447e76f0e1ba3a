"""The live monitor's loss surface: the ``landscape`` and ``curvature`` rows of a model while it trains.

Opt-in (``TopologyMonitor(..., surface=SurfaceSource(tokens, context))``; the train stage's runs with
``train.monitor_surface``). At a measured step that is due (:func:`due_batch`: every
``features.landscape_every``-th measured step, counted from step 0, as the features stage counts a run's
checkpoints) the training process copies the whole model to CPU (:func:`model_snapshot`: its config and
every tensor of its state dict, as float32 arrays) with the fixed batch of validation windows
(:func:`topometrics.features.forward.surface_batch`: the first ``features.landscape_batch`` windows of
``context`` tokens, the same at every step). The monitor's worker process rebuilds the model
(:func:`rebuilt_model`: our GPT from its config; a Hugging Face causal LM with
``AutoModelForCausalLM.from_config``, never remote code, in eval mode, as a series checkpoint is loaded)
and computes the rows with the very functions a checkpoint's forward pass uses
(:func:`topometrics.features.forward.loss_surface` and
:func:`~topometrics.features.checkpoint.surface_features`), so at a checkpoint's step they equal the
features stage's rows of that checkpoint. A step that is not due, a batch larger than the validation
tokens, a model that cannot be rebuilt and a snapshot with non-finite tensors give the rows NULL with
the reason; a non-finite loss on a slice NULLs that slice (the reasons of ``surface_values``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig

from topometrics.features.checkpoint import CheckpointFeatures, diverged_reason, surface_features, switched_off
from topometrics.features.forward import loss_surface, surface_batch
from topometrics.models.model import GPT, GPTConfig, gpt_on
from topometrics.params import FeaturesParams

Batch = tuple[torch.Tensor, torch.Tensor]  # (windows, context) int64 inputs and targets


class SurfaceSource(NamedTuple):
    """Where the fixed loss-surface batch comes from: the validation split's token ids and the window length.

    Our runs: ``load_tokens(corpus, "val")`` and the run's ``context``; a Hugging Face model: its own
    tokenizer's ids of the validation text (``topometrics.series.checkpoint.validation_tokens``) and
    the series' ``seq_len``, as the series' checkpoints get them.
    """

    tokens: np.ndarray  # (n,) token ids
    context: int  # tokens per window


class ModelSnapshot(NamedTuple):
    """Everything the worker needs to rebuild a model and compute its loss surface."""

    config: GPTConfig | PretrainedConfig
    state: dict[str, np.ndarray]  # the state dict's tensors as CPU arrays (floating ones as float32)
    batch: tuple[np.ndarray, np.ndarray]  # the loss-surface batch's inputs and targets


def due_batch(source: SurfaceSource, params: FeaturesParams, step: int, every: int) -> Batch | str:
    """The fixed loss-surface batch if measured step ``step`` is due for the loss surface, else why not.

    Measurement ``step // every`` (counted from step 0) is the ``index`` of
    :func:`topometrics.features.forward.surface_batch`: every ``features.landscape_every``-th one is
    due, so with ``every`` equal to the run's ``ckpt_every`` the same steps as the features stage's."""
    return surface_batch(source.tokens, source.context, params, step // every)


def model_snapshot(model: nn.Module, batch: Batch | str) -> ModelSnapshot | str:
    """A CPU copy of ``model`` with its loss-surface batch, or why there is none (the reason ``batch``
    is, a model the worker cannot rebuild)."""
    if isinstance(batch, str):
        return batch
    config = model_config(model)
    if isinstance(config, str):
        return config
    with torch.no_grad():
        state = {name: _cpu_array(t) for name, t in model.state_dict().items()}
    # numpy arrays, pickled to the worker as bytes (tensors would travel as shared-memory handles)
    return ModelSnapshot(config, state, (batch[0].numpy(), batch[1].numpy()))


def model_config(model: nn.Module) -> GPTConfig | PretrainedConfig | str:
    """What rebuilds ``model``: our GPT's config, a copy of a Hugging Face model's, or why neither applies."""
    if isinstance(model, GPT):
        return model.cfg
    config = getattr(model, "config", None)
    if isinstance(config, PretrainedConfig):
        return copy.deepcopy(config)  # the original may change while the snapshot waits for the worker
    kind = type(model).__name__
    return f"model not rebuildable for the loss surface: {kind} is neither our GPT nor a transformers model"


def state_bytes(model: nn.Module) -> int:
    """Bytes of :func:`model_snapshot`'s state (floating tensors as float32)."""
    return sum(t.numel() * (4 if t.is_floating_point() else t.element_size()) for t in model.state_dict().values())


def rebuilt_model(snapshot: ModelSnapshot) -> tuple[nn.Module, Callable | None]:
    """The model of a snapshot on CPU in float32, and its output -> logits function (None: the output).

    Our GPT as :func:`topometrics.features.checkpoint.checkpoint_features` builds it; a Hugging Face
    causal LM from its config (no remote code), strictly loaded, its head re-tied, in eval mode, as
    ``topometrics.series.checkpoint.load_causal_lm`` loads a series checkpoint."""
    state = {name: torch.from_numpy(array) for name, array in snapshot.state.items()}
    if isinstance(snapshot.config, GPTConfig):  # on the snapshot's own arrays: the weights held once
        return gpt_on(state, snapshot.config), None
    model = AutoModelForCausalLM.from_config(snapshot.config, trust_remote_code=False, dtype=torch.float32)
    model.load_state_dict(state)
    model.tie_weights()
    return model.eval(), lambda out: out.logits


def surface_rows(snapshot: ModelSnapshot | str, params: FeaturesParams) -> CheckpointFeatures:
    """The ``landscape`` and ``curvature`` rows (layer ``'all'``) of a snapshot, or NULL with the reason."""
    if isinstance(snapshot, ModelSnapshot):
        counts = [int((~np.isfinite(a)).sum()) for a in snapshot.state.values() if a.dtype.kind == "f"]
        if any(counts):  # the reason a diverged checkpoint's rows give (checkpoint.checkpoint_features)
            snapshot = diverged_reason([c for c in counts if c])
    if isinstance(snapshot, str):
        return switched_off(surface_features(snapshot, params), params)
    try:
        model, logits = rebuilt_model(snapshot)
    except (RuntimeError, ValueError, OSError) as err:
        reason = f"model not rebuildable for the loss surface: {err}".splitlines()[0]
        return switched_off(surface_features(reason, params), params)
    batch = tuple(torch.from_numpy(part) for part in snapshot.batch)
    return switched_off(surface_features(loss_surface(model, batch, logits), params), params)


def _cpu_array(tensor: torch.Tensor) -> np.ndarray:
    """A CPU copy as a numpy array (pickled to the worker as bytes); floating tensors as float32."""
    dtype = torch.float32 if tensor.is_floating_point() else tensor.dtype
    return tensor.detach().to("cpu", dtype, copy=True).numpy()
