"""External checkpoint series: the same features for checkpoints trained elsewhere.

A series is a Hugging Face model id with a list of revisions (default: ``EleutherAI/pythia-14m``
at the seven steps of the paper's Table 8) or a local folder with one checkpoint per step.
Every checkpoint gets exactly the features of ``topometrics.features`` (same functions, same
names, same tables), with ``rung`` = the series name; see ``docs/series.md``.

Loading rules
-------------
- **safetensors only**: pickle weights (``pytorch_model.bin``) are never downloaded or opened;
  ``trust_remote_code`` is never set.
- Hub revisions resolve through ``huggingface_hub.snapshot_download``, so the Hugging Face cache
  (``HF_HOME`` / ``HF_HUB_CACHE``) and ``HF_HUB_OFFLINE`` are honoured
  (``topometrics.series_checkpoints``). A revision that is neither cached nor downloadable is
  *skipped* with its reason, never an error.
- **Streaming**: weight features read one linear layer at a time with plain reads at the offsets
  of the safetensors header (pass 1: ``max |w|`` per layer in cache-sized chunks, for the global
  maximum of neural persistence; pass 2: one layer's array, its features, then it is freed), so
  peak memory is about the largest layer plus the fixed overhead. ``safe_open`` validates each
  file first (a truncated or corrupt file raises :class:`CheckpointError` naming it); it is not
  used to read, because it keeps the whole file mapped and resident pages then count towards the
  process's memory (3.3 GB for a Pythia-1B-shaped file, measured).
- Representation features load the model with ``transformers`` and its own tokenizer.

GPT-NeoX layer mapping (``gpt_neox.layers.{i}.`` + module, weights ``(out, in)`` like ours)::

    block{i}.attn.qkv  <- attention.query_key_value   (3d, d)
    block{i}.attn.out  <- attention.dense             (d, d)
    block{i}.mlp.in    <- mlp.dense_h_to_4h           (4d, d)
    block{i}.mlp.out   <- mlp.dense_4h_to_h           (d, 4d)

NeoX's fused QKV rows are interleaved per head (q, k, v of head 0, then head 1, ...) where ours
are stacked (all q, all k, all v). The rows are used as stored: NP, the spectral baselines and the
Vietoris-Rips diagram of all rows are invariant to a row permutation; only the seeded choice of
``max_points`` rows (and the seeded shuffled null) picks different, equally random, rows.
"""

from __future__ import annotations

import functools
import re
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors import safe_open
from torch.nn import functional as F
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from topometrics.checkpoints import CheckpointError
from topometrics.features import (
    DIAGRAM_COLUMNS,
    FEATURE_COLUMNS,
    CheckpointFeatures,
    ForwardPass,
    NoForwardPass,
    diagrams_frame,
    distance_features,
    features_frame,
    linear_and_forward_features,
    null_features,
    validation_batch,
)
from topometrics.params import FeaturesParams, SeriesParams, SeriesSource
from topometrics.safetensors_reader import SafetensorsFile
from topometrics.series_checkpoints import (
    SeriesCheckpoint,
    hub_checkpoints,
    local_checkpoints,
    skip_record,
    weights_sha256,
)

EXTRA_COLUMNS = ["series", "revision"]  # appended to both tables: the hub id or folder, and the revision/entry

# Our layer part -> GPT-NeoX module inside a block, in our network order.
NEOX_LINEAR = {
    "attn.qkv": "attention.query_key_value",
    "attn.out": "attention.dense",
    "mlp.in": "mlp.dense_h_to_4h",
    "mlp.out": "mlp.dense_4h_to_h",
}
_NEOX_TENSOR = re.compile(
    r"^(?P<blocks>(?:gpt_neox\.)?layers)\.(?P<block>\d+)\.(?P<module>"
    + "|".join(map(re.escape, NEOX_LINEAR.values()))
    + r")\.weight$"
)
_TOKEN_MARGIN = 64  # spare tokens when tokenising a prefix of the validation text


@dataclass
class SeriesResult:
    """One series' tables and per-checkpoint status."""

    features: list[pd.DataFrame] = field(default_factory=list)
    diagrams: list[pd.DataFrame] = field(default_factory=list)
    status: list[dict] = field(default_factory=list)


def neox_linear_layers(tensor_names) -> dict[str, str]:
    """Map GPT-NeoX linear weights onto our layer names, in our network order.

    Parameters
    ----------
    tensor_names : iterable of str
        State-dict keys, with or without the ``gpt_neox.`` prefix.

    Returns
    -------
    {``block{i}.attn.qkv`` ...: tensor name}
        Blocks in order, then qkv, attention out, MLP in, MLP out (biases, embeddings, layer
        norms and the head are excluded, as for our models).
    """
    found = {}
    for name in tensor_names:
        match = _NEOX_TENSOR.match(name)
        if match:
            found[(int(match["block"]), match["module"])] = name
    if not found:
        raise CheckpointError("no GPT-NeoX linear layers (gpt_neox.layers.{i}.attention.query_key_value.weight, ...)")
    blocks = max(block for block, _ in found) + 1
    missing = [f"{b}.{m}" for b in range(blocks) for m in NEOX_LINEAR.values() if (b, m) not in found]
    if missing:
        raise CheckpointError(f"incomplete GPT-NeoX blocks, missing layers.{missing[0]}.weight (+{len(missing) - 1})")
    return {f"block{b}.{part}": found[(b, module)] for b in range(blocks) for part, module in NEOX_LINEAR.items()}


def open_weights(files: tuple[Path, ...]) -> tuple[dict[str, SafetensorsFile], dict[str, str]]:
    """Validate the shards; return tensor name -> shard and our layer name -> tensor name."""
    shards = [SafetensorsFile(path) for path in files]
    shard_of = {name: shard for shard in shards for name in shard.names}
    try:
        layers = neox_linear_layers(shard_of)
    except CheckpointError as err:
        raise CheckpointError(f"{', '.join(str(p) for p in files)}: {err}") from err
    return shard_of, layers


# ---------------------------------------------------------------------------
# Features of one checkpoint
# ---------------------------------------------------------------------------


def load_causal_lm(ckpt: SeriesCheckpoint) -> torch.nn.Module:
    """The checkpoint as a float32 ``transformers`` model (safetensors only, no remote code)."""
    if ckpt.config_dir is None:
        raise OSError("no config.json beside the weights; transformers cannot build the model")
    in_folder = all(path.parent == ckpt.config_dir for path in ckpt.weights)
    index = ckpt.config_dir / "model.safetensors.index.json"
    if in_folder and ((ckpt.config_dir / "model.safetensors").is_file() or index.is_file()):  # save_pretrained
        return AutoModelForCausalLM.from_pretrained(
            ckpt.config_dir, use_safetensors=True, trust_remote_code=False, dtype=torch.float32
        ).eval()
    # A bare safetensors file with the series' config.json: build, then load strictly.
    config = AutoConfig.from_pretrained(ckpt.config_dir, trust_remote_code=False)
    model = AutoModelForCausalLM.from_config(config, trust_remote_code=False, dtype=torch.float32)
    state = {}
    for path in ckpt.weights:
        with safe_open(str(path), framework="pt") as f:
            state.update({name: f.get_tensor(name).float() for name in f.keys()})  # noqa: SIM118 (not a dict)
    model.load_state_dict(state, strict=True)
    return model.eval()


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


def causal_lm_on_batch(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, layers: dict[str, str]) -> ForwardPass:
    """As :func:`topometrics.features.model_on_batch`, for a ``transformers`` GPT-NeoX model.

    States are the residual stream after the last block, before the final layer norm (a forward
    hook on the last block: ``output_hidden_states`` differs across transformers versions on
    whether the last entry is normalised). Gradient norms are of the mapped linear weights.
    """
    last_block = layers[next(reversed(layers))].rsplit(".", 3)[0]  # gpt_neox.layers.{L-1}
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
    grads = {name: float(model.get_parameter(tensor).grad.norm()) for name, tensor in layers.items()}
    model.zero_grad(set_to_none=True)
    states = captured[0]
    return ForwardPass(states.reshape(-1, states.shape[-1]).double().numpy(), grads, float(loss.detach()))


def causal_lm_forward(
    ckpt: SeriesCheckpoint, layers: dict[str, str], text: str, params: FeaturesParams, seq_len: int
) -> ForwardPass:
    """The forward/backward pass of a series checkpoint on its fixed validation batch.

    The batch is ``features.rep_batch`` windows of ``seq_len`` tokens of the model's own
    tokenizer over the start of the validation text (:func:`topometrics.features.validation_batch`).
    Raises :class:`topometrics.features.NoForwardPass` with the reason when the model or the
    tokenizer cannot be loaded.
    """
    try:
        model = load_causal_lm(ckpt)
        if ckpt.tokenizer_dir is None:
            raise OSError("no tokenizer files (tokenizer.json, tokenizer_config.json) beside the weights")
        tokenizer = AutoTokenizer.from_pretrained(ckpt.tokenizer_dir)
        ids = validation_tokens(tokenizer, text, params.rep_batch * seq_len + 1)
        x, y = validation_batch(ids, seq_len, params.rep_batch)
    except (OSError, ValueError, RuntimeError) as err:
        raise NoForwardPass(f"model not loadable by transformers: {err}".splitlines()[0]) from err
    return causal_lm_on_batch(model, x, y, layers)


def series_checkpoint_features(
    ckpt: SeriesCheckpoint, text: str, params: FeaturesParams, seq_len: int
) -> tuple[CheckpointFeatures, list[str]]:
    """All features of one checkpoint but the distances; also returns its layer names.

    The weights are streamed: pass 1 reads each linear layer's ``max |w|`` (for neural
    persistence's global maximum), pass 2 is :func:`topometrics.features.linear_and_forward_features`
    reading one layer at a time, the same path as our checkpoints take. Raises
    :class:`CheckpointError` (message naming the file) for an unreadable checkpoint; a diverged one
    (NaN/Inf in a linear layer) gives NULLs with the reason and a ``RuntimeWarning``.
    """
    shard_of, layers = open_weights(ckpt.weights)
    loaders, global_max = streamed_linear_weights(shard_of, layers)
    if not np.isfinite(global_max):
        reason = "diverged: non-finite weights in a linear layer"
        warnings.warn(f"{ckpt.revision}: {reason}", RuntimeWarning, stacklevel=2)
        return null_features(list(layers), params, reason), list(layers)
    forward = functools.partial(causal_lm_forward, ckpt, layers, text, params, seq_len)
    return linear_and_forward_features(loaders, global_max, forward, params), list(layers)


def streamed_linear_weights(
    shard_of: dict[str, SafetensorsFile], layers: dict[str, str]
) -> tuple[dict[str, Callable[[], np.ndarray]], float]:
    """Loaders that read one linear layer each, and ``max |w|`` over all of them (NaN if any is not finite).

    The maximum is pass 1 over the files, in cache-sized chunks; a loader reads its layer when called.
    """
    absmax = [shard_of[tensor].absmax(tensor) for tensor in layers.values()]
    global_max = max(absmax) if np.isfinite(absmax).all() else float("nan")
    loaders = {layer: functools.partial(shard_of[tensor].read, tensor) for layer, tensor in layers.items()}
    return loaders, global_max


# ---------------------------------------------------------------------------
# A whole series
# ---------------------------------------------------------------------------


def series_features(
    name: str,
    source: SeriesSource,
    text: str,
    params: FeaturesParams,
    seq_len: int,
    cache_dir: Path | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> SeriesResult:
    """Features, diagrams and status of every checkpoint of one series, one checkpoint at a time.

    Distances (``*_prev``) are to the previous *computed* checkpoint of the series. A checkpoint
    that cannot be resolved or read is recorded as skipped with the reason; the others are kept.
    """
    label = source.model or str(source.path)
    ckpts = (
        hub_checkpoints(source.model, source.revisions, cache_dir)
        if source.model
        else local_checkpoints(Path(source.path))
    )
    result, prev, hashes = SeriesResult(), None, {}
    for ckpt in ckpts:
        if isinstance(ckpt, dict):
            progress(f"{name} {ckpt['revision']}: skipped: {ckpt['reason']}")
            result.status.append(ckpt)
            continue
        start = time.perf_counter()
        try:
            cur, layers = series_checkpoint_features(ckpt, text, params, seq_len)
        except CheckpointError as err:
            progress(f"{name} {ckpt.revision}: skipped: {err}")
            result.status.append(skip_record(ckpt.revision, ckpt.step, str(err)))
            continue
        cur.rows.extend(distance_features(prev, cur, layers).rows)
        prev = cur
        extra = {"series": label, "revision": ckpt.revision}
        result.features.append(features_frame(cur, name, source.seed, ckpt.step).assign(**extra))
        result.diagrams.append(diagrams_frame(cur, name, source.seed, ckpt.step).assign(**extra))
        digest = weights_sha256(ckpt.weights)
        seconds = time.perf_counter() - start
        computed = {"revision": ckpt.revision, "step": ckpt.step, "status": "computed", "reason": None}
        files = [str(p) for p in ckpt.weights]
        computed |= {"seconds": round(seconds, 3), "files": files, "weights_sha256": digest}
        result.status.append(computed | {"duplicate_of": hashes.get(digest)})
        if digest is not None:
            hashes.setdefault(digest, ckpt.revision)
        progress(f"{name} {ckpt.revision} (step {ckpt.step}): computed in {seconds:.1f} s")
    return result


def run_series(
    params: SeriesParams,
    features: FeaturesParams,
    text: str,
    cache_dir: Path | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Every configured series: the features and diagrams tables and the status document.

    Returns
    -------
    features : DataFrame
        :data:`topometrics.features.FEATURE_COLUMNS` + ``series``, ``revision``.
    diagrams : DataFrame
        :data:`topometrics.features.DIAGRAM_COLUMNS` + ``series``, ``revision``.
    status : dict
        ``{"series": [{name, model, path, seed, computed, skipped, checkpoints: [...]}]}`` where each
        checkpoint has ``revision, step, status ('computed' | 'skipped'), reason`` (and, when
        computed, ``seconds, files, weights_sha256, duplicate_of``).
    """
    feature_parts, diagram_parts, status = [], [], []
    for name, source in params.sources.items():
        result = series_features(name, source, text, features, params.seq_len, cache_dir, progress)
        feature_parts += result.features
        diagram_parts += result.diagrams
        counts = {s: sum(c["status"] == s for c in result.status) for s in ("computed", "skipped")}
        status.append({"name": name, "model": source.model, "path": source.path, "seed": source.seed, **counts,
                       "checkpoints": result.status})  # fmt: skip
    return _concat(feature_parts, FEATURE_COLUMNS), _concat(diagram_parts, DIAGRAM_COLUMNS), {"series": status}


def _concat(parts: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    if parts:
        return pd.concat(parts, ignore_index=True)
    # No checkpoint computed (e.g. offline): an empty table with the same columns and types.
    types = {
        "seed": "int64",
        "step": "int64",
        "dim": "int64",
        "value": "float64",
        "birth": "float64",
        "death": "float64",
    }
    return pd.DataFrame({c: pd.Series(dtype=types.get(c, "str")) for c in columns + EXTRA_COLUMNS})
