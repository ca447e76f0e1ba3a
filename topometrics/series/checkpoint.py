"""External checkpoint series: the same features for checkpoints trained elsewhere.

A series is a Hugging Face model id with a list of revisions (default: ``EleutherAI/pythia-14m``
at the seven steps of the paper's Table 8) or a local folder with one checkpoint per step.
Every checkpoint gets exactly the features of ``topometrics.features.checkpoint`` (same functions, same
names, same tables), with ``rung`` = the series name; see ``docs/series.md``.

Loading rules
-------------
- **safetensors only**: pickle weights (``pytorch_model.bin``) are never downloaded or opened;
  ``trust_remote_code`` is never set.
- Hub revisions resolve through ``huggingface_hub.snapshot_download``, so the Hugging Face cache
  (``HF_HOME`` / ``HF_HUB_CACHE``) and ``HF_HUB_OFFLINE`` are honoured
  (``topometrics.series.hub``). A revision that is neither cached nor downloadable is
  *skipped* with its reason, never an error.
- **Streaming**: weight features read one linear layer at a time with plain reads at the offsets
  of the safetensors header (pass 1: ``max |w|`` per layer in cache-sized chunks, for the global
  maximum of neural persistence; pass 2: one layer's array, its features, then it is freed), so
  peak memory is about the largest layer plus the fixed overhead. ``safe_open`` validates each
  file first (a truncated or corrupt file raises :class:`CheckpointError` naming it); it is not
  used to read, because it keeps the whole file mapped and resident pages then count towards the
  process's memory (3.3 GB for a Pythia-1B-shaped file, measured).
- Representation features load the model with ``transformers`` and its own tokenizer.

Linear layers of any decoder family are found by ``topometrics.models.architectures`` (tensor-name rules
derived from the family's ``transformers`` module tree, or a ``layers:`` option), under canonical
names (``block{i}.attn.qkv``, ``block{i}.mlp.gate``, ...); run folders (Trainer output, plain
safetensors files) resolve through ``topometrics.series.run_folders``, with their losses. A whole series
(every checkpoint as a shard, and a live monitor's log folder read as computed) is
``topometrics.series.source_shards``.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from torch.nn import functional as F
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from topometrics.features.checkpoint import CheckpointFeatures, linear_and_forward_features, null_features
from topometrics.features.forward import (
    ForwardPass,
    NoForwardPass,
    loss_surface,
    on_device,
    surface_batch,
    validation_batch,
)
from topometrics.features.gradient_cloud import Clouds, clouds_of, gradient_batch, run_with_clouds
from topometrics.models.architectures import (
    LinearLayer,
    block_path,
    checkpoint_layers,
    module_layers,
    oriented,
)
from topometrics.models.checkpoints import CheckpointError
from topometrics.models.model import pick_device
from topometrics.models.tokens import bits_per_byte
from topometrics.params import FeaturesParams
from topometrics.series.hub import SeriesCheckpoint
from topometrics.series.safetensors_reader import SafetensorsFile

_TOKEN_MARGIN = 64  # spare tokens when tokenising a prefix of the validation text


def open_weights(
    files: tuple[Path, ...], config_dir: Path | None = None, layers: Mapping[str, str] | None = None
) -> tuple[dict[str, SafetensorsFile], dict[str, LinearLayer]]:
    """Validate the shards; return tensor name -> shard and canonical layer name -> layer.

    Layers come from ``layers`` (a ``layers:`` option), else from the family of
    ``config_dir/config.json``, else from the tensor names (``topometrics.models.architectures``); an
    architecture no rule covers raises :class:`ArchitectureError` listing its 2-D tensors.
    """
    shards = [SafetensorsFile(path) for path in files]
    if problem := next((p for shard in shards if (p := shard.size_problem())), None):
        raise CheckpointError(problem)
    shard_of = {name: shard for shard in shards for name in shard.names}
    shapes = {name: tuple(shard.header[name]["shape"]) for name, shard in shard_of.items()}
    found = checkpoint_layers(shapes, config_dir, layers, ", ".join(str(p) for p in files))
    return shard_of, {layer.name: layer for layer in found}


# ---------------------------------------------------------------------------
# Features of one checkpoint
# ---------------------------------------------------------------------------


def load_causal_lm(ckpt: SeriesCheckpoint) -> torch.nn.Module:
    """The checkpoint as a float32 ``transformers`` model (safetensors only, no remote code)."""
    if ckpt.config_dir is None:
        raise OSError("no config.json beside the weights; transformers cannot build the model")
    config = AutoConfig.from_pretrained(ckpt.config_dir, trust_remote_code=False)
    check_config_fits(config, ckpt.weights)
    in_folder = all(path.parent == ckpt.config_dir for path in ckpt.weights)
    index = ckpt.config_dir / "model.safetensors.index.json"
    if in_folder and ((ckpt.config_dir / "model.safetensors").is_file() or index.is_file()):  # save_pretrained
        return AutoModelForCausalLM.from_pretrained(
            ckpt.config_dir, use_safetensors=True, trust_remote_code=False, dtype=torch.float32
        ).eval()
    # A bare safetensors file with the series' config.json: build, then load strictly.
    model = AutoModelForCausalLM.from_config(config, trust_remote_code=False, dtype=torch.float32)
    state = {}
    for path in ckpt.weights:
        with safe_open(str(path), framework="pt") as f:
            state.update({name: f.get_tensor(name).float() for name in f.keys()})  # noqa: SIM118 (not a dict)
    # A head tied to the embedding is not in the file (safetensors stores shared tensors once).
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    result = model.load_state_dict(state, strict=False)
    if set(result.missing_keys) - tied or result.unexpected_keys:
        missing = sorted(set(result.missing_keys) - tied)
        raise RuntimeError(f"state dict does not fit {type(model).__name__}: missing {missing[:3]}, "
                           f"unexpected {result.unexpected_keys[:3]}")  # fmt: skip
    model.tie_weights()
    return model.eval()


def held_parameters(files: tuple[Path, ...]) -> int:
    """Elements of every tensor the safetensors ``files`` hold, from their headers (a tied head stored once: once)."""
    return sum(math.prod(shard.shape(name)) for shard in map(SafetensorsFile, files) for name in shard.names)


def check_config_fits(config, files: tuple[Path, ...]) -> None:
    """``ValueError`` when ``config`` (a config.json's) describes a model with more parameters than the weights
    hold: its sizes are a stranger's, and transformers allocates them all before loading a tensor. Counted on
    PyTorch's meta device (no memory); a head tied to the embedding may be absent from the file, hence the margin."""
    with torch.device("meta"):
        described = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    held = held_parameters(files)
    if described > 2 * held:
        raise ValueError(f"its config.json describes {described:,} parameters, its weights hold {held:,}")


# The warehouse's ``rungs`` columns and the config attribute each is read from (transformers' attribute maps name
# them alike for every family: GPT-2's n_embd answers to hidden_size, n_positions to max_position_embeddings).
SHAPE_ATTRIBUTES = {
    "hidden": "hidden_size", "layers": "num_hidden_layers", "heads": "num_attention_heads",
    "vocab_size": "vocab_size", "context": "max_position_embeddings",
}  # fmt: skip


def checkpoint_shape(ckpt: SeriesCheckpoint) -> dict[str, int | None]:
    """The checkpoint's ``n_params`` (elements of every tensor its safetensors files hold: a head tied to the
    embedding and stored once counts once) and the ``hidden, layers, heads, vocab_size, context`` its config.json
    states (None where it has none, or there is no config.json). Headers and the config only: nothing is loaded."""
    n_params = held_parameters(ckpt.weights)
    shape = dict.fromkeys(SHAPE_ATTRIBUTES)
    path = None if ckpt.config_dir is None else Path(ckpt.config_dir) / "config.json"
    if path is not None and path.is_file():
        try:
            config = AutoConfig.from_pretrained(path.parent, trust_remote_code=False)
        except (ValueError, KeyError, OSError):  # a family transformers does not know (its layers: mapped by hand)
            return {"n_params": n_params, **shape}
        for column, attribute in SHAPE_ATTRIBUTES.items():
            value = getattr(config, attribute, None)
            shape[column] = value if isinstance(value, int) and not isinstance(value, bool) else None
    return {"n_params": n_params, **shape}


def validation_tokens(tokenizer, text: str, needed: int) -> np.ndarray:
    """The first ``needed`` (or all) token ids of ``text`` under the model's own tokenizer.

    Tokenises growing prefixes rather than the whole validation split (~1M characters); a prefix
    is long enough once it has ``_TOKEN_MARGIN`` tokens to spare, so the word cut at its end cannot
    change the tokens kept.
    """
    chars = 8 * needed
    while True:
        ids = tokenizer(text[:chars], add_special_tokens=False)["input_ids"]
        if len(ids) >= needed + _TOKEN_MARGIN or chars >= len(text):
            return np.asarray(ids[:needed], dtype=np.int64)
        chars *= 4


def own_tokens(folder: Path | None, text: str, needed: int, model: torch.nn.Module) -> tuple[object, np.ndarray]:
    """The model's own tokenizer (from ``folder``) and the first ``needed`` ids of ``text`` under it.

    Raises :class:`NoForwardPass` naming the tokenizer file and the fix when there is none, when it cannot be
    loaded or used (truncated, missing keys), or when it gives ids beyond the model's embedding (a tokenizer of
    another model): only the families that need a forward pass are lost, never the weight families.
    """
    if folder is None:
        raise NoForwardPass("no tokenizer files (tokenizer.json, tokenizer_config.json) beside the weights; "
                            "put the model's own beside config.json")  # fmt: skip
    fix = "give the series the tokenizer files the model was trained with"
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        ids = validation_tokens(tokenizer, text, needed)
    # The tokenizers library (Rust) raises a bare Exception for a malformed tokenizer.json, transformers a KeyError
    # or TypeError for a missing key: any of them means this file cannot tokenise, and is this checkpoint's reason.
    except Exception as err:  # noqa: BLE001
        why = f"{type(err).__name__}: {err}".splitlines()[0][:120]
        raise NoForwardPass(f"{folder / 'tokenizer.json'}: cannot tokenise the text ({why}); {fix}") from err
    rows = model.get_input_embeddings().num_embeddings
    if ids.size and int(ids.max()) >= rows:
        raise NoForwardPass(f"{folder / 'tokenizer.json'}: token id {int(ids.max())} is beyond the model's {rows} "
                            f"embeddings (a tokenizer of another model?); {fix}")  # fmt: skip
    return tokenizer, ids


def causal_lm_on_batch(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    surface: tuple[torch.Tensor, torch.Tensor] | str = "none",
    gradients: tuple[torch.Tensor, torch.Tensor] | str = "no gradient batch",
    clouds: Clouds | None = None,
) -> ForwardPass:
    """As :func:`topometrics.features.forward.model_on_batch`, for a ``transformers`` causal LM of any family.

    States are the residual stream after the last block, before the final layer norm (a forward
    hook on the last block: ``output_hidden_states`` differs across transformers versions on
    whether the last entry is normalised). Gradient norms are of the linear weights of the model's
    module tree (``topometrics.models.architectures.module_layers``), under their canonical names.
    ``clouds``: as for ``model_on_batch`` (one pass for both families when the batches are one).
    """
    layers = {layer.name: layer.tensor for layer in module_layers(model)}
    last_block = block_path(layers[next(reversed(layers))])  # e.g. gpt_neox.layers.{L-1}
    done = {}

    def run() -> None:
        captured = []
        hook = model.get_submodule(last_block).register_forward_hook(
            lambda _m, _i, out: captured.append((out[0] if isinstance(out, tuple) else out).detach())
        )
        try:
            model.zero_grad(set_to_none=True)
            logits = model(input_ids=x).logits
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
            loss.backward()
        finally:
            hook.remove()
        done["grads"] = {name: float(model.get_parameter(tensor).grad.norm()) for name, tensor in layers.items()}
        done.update(loss=float(loss.detach()), states=captured[0])
        model.zero_grad(set_to_none=True)

    cloud = run_with_clouds(model, layers, (x, y), gradients, clouds, run)
    flat = done["states"].reshape(-1, done["states"].shape[-1]).double().cpu().numpy()
    surface = loss_surface(model, surface, lambda out: out.logits)
    return ForwardPass(flat, done["grads"], done["loss"], surface, gradients=cloud)


def causal_lm_forward(
    ckpt: SeriesCheckpoint, text: str, params: FeaturesParams, seq_len: int, index: int = 0
) -> ForwardPass:
    """The forward/backward pass of a series checkpoint on its fixed validation batch.

    The batch is ``features.rep_batch`` windows of ``seq_len`` tokens of the model's own
    tokenizer over the start of the validation text (:func:`topometrics.features.forward.validation_batch`);
    the loss-surface batch the first ``features.landscape_batch`` windows of it, for the ``index``-th
    checkpoint of the series (:func:`topometrics.features.forward.surface_batch`).
    Raises :class:`topometrics.features.forward.NoForwardPass` with the reason when the model or the
    tokenizer cannot be loaded.
    """
    try:
        model = load_causal_lm(ckpt)
    except (OSError, ValueError, RuntimeError) as err:
        raise NoForwardPass(f"model not loadable by transformers: {err}".splitlines()[0]) from err
    windows = max(params.rep_batch, params.landscape_batch, params.grad_batch)
    tokenizer, ids = own_tokens(ckpt.tokenizer_dir, text, windows * seq_len + 1, model)
    x, y = validation_batch(ids, seq_len, params.rep_batch)
    targets = tokenizer.decode(y.reshape(-1).tolist(), skip_special_tokens=False, clean_up_tokenization_spaces=False)
    # bits per byte of the targets' text under the model's own tokenizer
    grads = gradient_batch(ids, seq_len, params)
    device = pick_device(params.device, "features.device")
    model.to(device)
    batches = [on_device(b, device) for b in ((x, y), surface_batch(ids, seq_len, params, index), grads)]
    result = causal_lm_on_batch(model, *batches[0], batches[1], batches[2], clouds_of(params))
    return result._replace(bpb=bits_per_byte(result.loss, y.numel(), len(targets.encode("utf-8"))))


def series_checkpoint_features(
    ckpt: SeriesCheckpoint,
    text: str | None,
    params: FeaturesParams,
    seq_len: int,
    layers: Mapping[str, str] | None = None,
    index: int = 0,
) -> tuple[CheckpointFeatures, list[str]]:
    """All features of one checkpoint but the distances; also returns its layer names. ``index``: its
    place in the series (``features.landscape_every``); ``text`` None: no forward pass (weight features only).

    The weights are streamed: pass 1 reads each linear layer's ``max |w|`` (for neural
    persistence's global maximum), pass 2 is :func:`topometrics.features.checkpoint.linear_and_forward_features`
    reading one layer at a time, the same path as our checkpoints take. Raises
    :class:`CheckpointError` (message naming the file) for an unreadable checkpoint; a diverged one
    (NaN/Inf in a linear layer) gives NULLs with the reason and a ``RuntimeWarning``.
    """
    shard_of, layers = open_weights(ckpt.weights, ckpt.config_dir, layers)
    loaders, global_max = streamed_linear_weights(shard_of, layers)
    if not np.isfinite(global_max):
        reason = "diverged: non-finite weights in a linear layer"
        warnings.warn(f"{ckpt.revision}: {reason}", RuntimeWarning, stacklevel=2)
        return null_features(list(layers), params, reason), list(layers)
    forward = None if text is None else functools.partial(causal_lm_forward, ckpt, text, params, seq_len, index)
    return linear_and_forward_features(loaders, global_max, forward, params), list(layers)


def streamed_linear_weights(
    shard_of: dict[str, SafetensorsFile], layers: dict[str, LinearLayer]
) -> tuple[dict[str, Callable[[], np.ndarray]], float]:
    """Loaders that read one linear layer each as ``(out, in)``, and ``max |w|`` over all of them
    (NaN if any is not finite).

    The maximum is pass 1 over the files, in cache-sized chunks; a loader reads its layer when called.
    """
    absmax = [shard_of[layer.tensor].absmax(layer.tensor) for layer in layers.values()]
    global_max = max(absmax) if np.isfinite(absmax).all() else float("nan")
    loaders = {name: functools.partial(_read_layer, shard_of[layer.tensor], layer) for name, layer in layers.items()}
    return loaders, global_max


def _read_layer(shard: SafetensorsFile, layer: LinearLayer) -> np.ndarray:
    return oriented(shard.read(layer.tensor), layer.transposed)
