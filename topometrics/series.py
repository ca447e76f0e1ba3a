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

Linear layers of any decoder family are found by ``topometrics.architectures`` (tensor-name rules
derived from the family's ``transformers`` module tree, or a ``layers:`` option), under canonical
names (``block{i}.attn.qkv``, ``block{i}.mlp.gate``, ...); run folders (Trainer output, plain
safetensors files) resolve through ``topometrics.run_folders``, with their losses; a live
monitor's log folder (``topometrics.monitor_log``) is read as computed.
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors import safe_open
from torch.nn import functional as F
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from topometrics.architectures import (
    ArchitectureError,
    LinearLayer,
    block_path,
    checkpoint_layers,
    module_layers,
    oriented,
)
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
from topometrics.monitor_log import read_log, read_stop
from topometrics.params import FeaturesParams, SeriesParams, SeriesSource
from topometrics.run_folders import RunCheckpoint, RunFolderError, scan_run_folder
from topometrics.safetensors_reader import SafetensorsFile
from topometrics.series_checkpoints import SeriesCheckpoint, hub_checkpoints, skip_record, weights_sha256

CHECKPOINT_COLUMNS = ["rung", "seed", "step", "val_loss", "train_loss", "reason"]  # the warehouse's checkpoints
EXTRA_COLUMNS = ["series", "revision"]  # appended to both tables: the hub id or folder, and the revision/entry

_TOKEN_MARGIN = 64  # spare tokens when tokenising a prefix of the validation text


@dataclass
class SeriesResult:
    """One series' tables and per-checkpoint status."""

    features: list[pd.DataFrame] = field(default_factory=list)
    diagrams: list[pd.DataFrame] = field(default_factory=list)
    status: list[dict] = field(default_factory=list)
    losses: list[pd.DataFrame] = field(default_factory=list)  # CHECKPOINT_COLUMNS rows of computed steps


def open_weights(
    files: tuple[Path, ...], config_dir: Path | None = None, layers: Mapping[str, str] | None = None
) -> tuple[dict[str, SafetensorsFile], dict[str, LinearLayer]]:
    """Validate the shards; return tensor name -> shard and canonical layer name -> layer.

    Layers come from ``layers`` (a ``layers:`` option), else from the family of
    ``config_dir/config.json``, else from the tensor names (``topometrics.architectures``); an
    architecture no rule covers raises :class:`ArchitectureError` listing its 2-D tensors.
    """
    shards = [SafetensorsFile(path) for path in files]
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
    # A head tied to the embedding is not in the file (safetensors stores shared tensors once).
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    result = model.load_state_dict(state, strict=False)
    if set(result.missing_keys) - tied or result.unexpected_keys:
        missing = sorted(set(result.missing_keys) - tied)
        raise RuntimeError(f"state dict does not fit {type(model).__name__}: missing {missing[:3]}, "
                           f"unexpected {result.unexpected_keys[:3]}")  # fmt: skip
    model.tie_weights()
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


def causal_lm_on_batch(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> ForwardPass:
    """As :func:`topometrics.features.model_on_batch`, for a ``transformers`` causal LM of any family.

    States are the residual stream after the last block, before the final layer norm (a forward
    hook on the last block: ``output_hidden_states`` differs across transformers versions on
    whether the last entry is normalised). Gradient norms are of the linear weights of the model's
    module tree (``topometrics.architectures.module_layers``), under their canonical names.
    """
    layers = {layer.name: layer.tensor for layer in module_layers(model)}
    last_block = block_path(layers[next(reversed(layers))])  # e.g. gpt_neox.layers.{L-1}
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


def causal_lm_forward(ckpt: SeriesCheckpoint, text: str, params: FeaturesParams, seq_len: int) -> ForwardPass:
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
    return causal_lm_on_batch(model, x, y)


def series_checkpoint_features(
    ckpt: SeriesCheckpoint, text: str, params: FeaturesParams, seq_len: int, layers: Mapping[str, str] | None = None
) -> tuple[CheckpointFeatures, list[str]]:
    """All features of one checkpoint but the distances; also returns its layer names.

    The weights are streamed: pass 1 reads each linear layer's ``max |w|`` (for neural
    persistence's global maximum), pass 2 is :func:`topometrics.features.linear_and_forward_features`
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
    forward = functools.partial(causal_lm_forward, ckpt, text, params, seq_len)
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
    if source.log is not None:
        return log_series(name, source, progress)
    label = source.model or str(source.path)
    if source.model:
        ckpts = hub_checkpoints(source.model, source.revisions, cache_dir)
    else:
        try:
            folder = scan_run_folder(Path(source.path), Path(source.losses) if source.losses else None)
        except RunFolderError as err:
            progress(f"{name}: skipped: {err}")
            return SeriesResult(status=[skip_record(source.path, None, str(err))])
        ckpts = [*folder.skipped, *folder.checkpoints]
    result, prev, hashes = SeriesResult(), None, {}
    for ckpt in ckpts:
        if isinstance(ckpt, dict):
            progress(f"{name} {ckpt['revision']}: skipped: {ckpt['reason']}")
            result.status.append(ckpt)
            continue
        start = time.perf_counter()
        try:
            cur, layers = series_checkpoint_features(ckpt, text, params, seq_len, source.layers)
        except (CheckpointError, ArchitectureError) as err:
            progress(f"{name} {ckpt.revision}: skipped: {err}")
            result.status.append(skip_record(ckpt.revision, ckpt.step, str(err)))
            continue
        cur.rows.extend(distance_features(prev, cur, layers).rows)
        prev = cur
        extra = {"series": label, "revision": ckpt.revision}
        result.features.append(features_frame(cur, name, source.seed, ckpt.step).assign(**extra))
        result.diagrams.append(diagrams_frame(cur, name, source.seed, ckpt.step).assign(**extra))
        if isinstance(ckpt, RunCheckpoint):  # a run folder's losses at this step (hub revisions have none)
            row = (name, source.seed, ckpt.step, ckpt.val_loss, ckpt.train_loss, ckpt.loss_reason)
            result.losses.append(pd.DataFrame([row], columns=CHECKPOINT_COLUMNS))
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


def log_series(name: str, source: SeriesSource, progress: Callable[[str], None] = lambda line: None) -> SeriesResult:
    """A live monitor's log folder as a series: its complete files, as computed (``topometrics.monitor``).

    The rows keep their values; ``rung``/``seed`` become the series name and seed. Every measured
    step is a computed checkpoint; a folder with no complete file is one skip; an early stop
    (``stop.json``) is in the status of its step.
    """
    folder = Path(source.log)
    features, losses = read_log(folder) if folder.is_dir() else (pd.DataFrame(), pd.DataFrame())
    if features.empty:
        reason = f"{folder}: no features-<step>.parquet files (is it a TopologyMonitor log folder?)"
        progress(f"{name}: skipped: {reason}")
        return SeriesResult(status=[skip_record(folder.name, None, reason)])
    stop = read_stop(folder)
    extra = {"series": str(folder), "revision": "live"}
    result = SeriesResult(features=[features.assign(rung=name, seed=source.seed, **extra)])
    for step in sorted(features["step"].unique()):
        note = stop.get("reason") if stop.get("step") == step else None
        result.status.append({"revision": f"live step {step}", "step": int(step), "status": "computed", "reason": note})
    measured = losses[losses["step"].isin(features["step"])]
    missing = measured[["val_loss", "train_loss"]].isna().any(axis=1)
    reason = np.where(missing, "not logged at this step (TopologyMonitor.record_losses)", None)
    result.losses.append(measured.assign(rung=name, seed=source.seed, reason=reason)[CHECKPOINT_COLUMNS])
    progress(f"{name}: {len(result.status)} live measurements from {folder}")
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
    checkpoints : DataFrame
        :data:`CHECKPOINT_COLUMNS`: the losses of run folders and monitor logs at computed steps
        (NULL with the reason when not logged), for the warehouse's ``checkpoints`` table.
    status : dict
        ``{"series": [{name, model, path, seed, computed, skipped, checkpoints: [...]}]}`` where each
        checkpoint has ``revision, step, status ('computed' | 'skipped'), reason`` (and, when
        computed, ``seconds, files, weights_sha256, duplicate_of``).
    """
    feature_parts, diagram_parts, loss_parts, status = [], [], [], []
    for name, source in params.sources.items():
        result = series_features(name, source, text, features, params.seq_len, cache_dir, progress)
        feature_parts += result.features
        diagram_parts += result.diagrams
        loss_parts += result.losses
        counts = {s: sum(c["status"] == s for c in result.status) for s in ("computed", "skipped")}
        status.append({"name": name, "model": source.model, "path": source.path, "seed": source.seed, **counts,
                       "checkpoints": result.status})  # fmt: skip
    tables = _concat(feature_parts, FEATURE_COLUMNS), _concat(diagram_parts, DIAGRAM_COLUMNS)
    return *tables, _losses(loss_parts), {"series": status}


def _losses(parts: list[pd.DataFrame]) -> pd.DataFrame:
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=CHECKPOINT_COLUMNS)
    types = {"seed": "int64", "step": "int64", "val_loss": "float64", "train_loss": "float64", "reason": "object"}
    return frame.astype(types)


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
