"""External checkpoint series: the same features for checkpoints trained elsewhere (issue 6).

A series is a Hugging Face model id with a list of revisions (default: ``EleutherAI/pythia-14m``
at the seven steps of the seed paper's Table 8) or a local folder with one checkpoint per step.
Every checkpoint gets exactly the features of ``topometrics.features`` (same functions, same
names, same tables), with ``rung`` = the series name; see ``docs/series.md``.

Loading rules
-------------
- **safetensors only**: pickle weights (``pytorch_model.bin``) are never downloaded or opened;
  ``trust_remote_code`` is never set.
- Hub revisions resolve through ``huggingface_hub.snapshot_download``, so the Hugging Face cache
  (``HF_HOME`` / ``HF_HUB_CACHE``) and ``HF_HUB_OFFLINE`` are honoured. A revision that is neither
  cached nor downloadable is *skipped* with its reason, never an error.
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
import json
import os
import re
import struct
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from huggingface_hub import snapshot_download
from safetensors import SafetensorError, safe_open
from torch.nn import functional as F
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from topometrics.checkpoints import CheckpointError
from topometrics.features import (
    ALL,
    DIAGRAM_COLUMNS,
    FEATURE_COLUMNS,
    CheckpointFeatures,
    diagrams_frame,
    distance_features,
    features_frame,
    loaded_weight_features,
    null_features,
    rep_feature_names,
    representation_features,
    validation_batch,
)
from topometrics.params import FeaturesParams, SeriesParams, SeriesSource
from topometrics.vocabulary import GRADIENT, model_level, per_layer

# Files fetched per hub revision: weights, configs, tokenizer. Never *.bin (pickle).
HUB_PATTERNS = ["*.safetensors", "*.json", "tokenizer*"]
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
_STEP_NAME = re.compile(r"(?:step|checkpoint)[-_]?(\d+)", re.IGNORECASE)
_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16}
_CHUNK_BYTES = 1 << 20  # pass-1 read size: the read and abs/max touch the same cache-resident bytes
_MAX_READ = 1 << 30  # bytes per read call (Linux returns at most ~2 GiB per read)
_TOKEN_MARGIN = 64  # spare tokens when tokenising a prefix of the validation text


@dataclass(frozen=True)
class SeriesCheckpoint:
    """One checkpoint of a series, resolved to local files."""

    step: int
    revision: str  # hub revision, or the entry's name in a local folder
    weights: tuple[Path, ...]  # safetensors files (shards) holding the state dict
    config_dir: Path | None  # folder with config.json for transformers (None: weight features only)
    tokenizer_dir: Path | None  # folder with the model's own tokenizer files


@dataclass
class SeriesResult:
    """One series' tables and per-checkpoint status."""

    features: list[pd.DataFrame] = field(default_factory=list)
    diagrams: list[pd.DataFrame] = field(default_factory=list)
    status: list[dict] = field(default_factory=list)


# ---------------------------------------------------------------------------
# Streaming reads of safetensors
# ---------------------------------------------------------------------------


class SafetensorsFile:
    """Single tensors of a safetensors file, read with plain reads (the file is never kept mapped).

    Parameters
    ----------
    path : Path
        The file. It is validated with ``safetensors.safe_open`` first; a truncated or corrupt file
        raises :class:`CheckpointError` whose message starts with the path.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            with safe_open(str(self.path), framework="numpy"):  # checks the header and the file length
                pass
            with open(self.path, "rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(size))
        except (SafetensorError, OSError, ValueError) as err:
            raise CheckpointError(f"{self.path}: not a readable safetensors file ({err}); re-download it") from err
        header.pop("__metadata__", None)
        self.header = header
        self.data_start = 8 + size

    @property
    def names(self) -> list[str]:
        return list(self.header)

    def _entry(self, name: str) -> tuple[np.dtype, tuple[int, ...], int, int]:
        entry = self.header[name]
        if entry["dtype"] not in _DTYPES:
            raise CheckpointError(f"{self.path}: tensor {name} has dtype {entry['dtype']}; expected a float type")
        start, stop = entry["data_offsets"]
        return np.dtype(_DTYPES[entry["dtype"]]), tuple(entry["shape"]), self.data_start + start, stop - start

    def absmax(self, name: str) -> float:
        """``max |w|`` of one tensor in ~1 MiB chunks (NaN if any entry is NaN, inf if any is inf)."""
        dtype, _, offset, nbytes = self._entry(name)
        buf = np.empty(_CHUNK_BYTES, dtype=np.uint8)
        best = np.float64(0.0)
        with open(self.path, "rb", buffering=0) as f:
            f.seek(offset)
            for done in range(0, nbytes, _CHUNK_BYTES):
                raw = buf[: _read_into(f, buf[: min(_CHUNK_BYTES, nbytes - done)], self.path)]
                chunk = _as_float(raw.view(dtype), self.header[name]["dtype"])
                best = np.maximum(best, np.abs(chunk).max(initial=0.0))  # np.maximum propagates NaN
        return float(best)

    def read(self, name: str) -> np.ndarray:
        """One tensor as a float32 array of its stored shape (bf16/fp16/fp64 converted)."""
        dtype, shape, offset, nbytes = self._entry(name)
        raw = np.empty(nbytes, dtype=np.uint8)
        with open(self.path, "rb", buffering=0) as f:
            f.seek(offset)
            _read_into(f, raw, self.path)
        return _as_float(raw.view(dtype), self.header[name]["dtype"]).astype(np.float32, copy=False).reshape(shape)


def _read_into(f, out: np.ndarray, path: Path) -> int:
    view, done = memoryview(out), 0
    while done < out.size:
        got = f.readinto(view[done : done + _MAX_READ])
        if not got:
            raise CheckpointError(f"{path}: file ends inside a tensor (truncated); re-download it")
        done += got
    return done


def _as_float(values: np.ndarray, dtype_name: str) -> np.ndarray:
    if dtype_name == "BF16":  # bfloat16 is the top half of a float32
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values


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
    where = {name: shard for shard in shards for name in shard.names}
    try:
        layers = neox_linear_layers(where)
    except CheckpointError as err:
        raise CheckpointError(f"{', '.join(str(p) for p in files)}: {err}") from err
    return where, layers


# ---------------------------------------------------------------------------
# Features of one checkpoint
# ---------------------------------------------------------------------------


def streamed_weight_features(
    where: dict[str, SafetensorsFile], layers: dict[str, str], params: FeaturesParams
) -> CheckpointFeatures | None:
    """Weight features of every linear layer, one layer in memory at a time.

    Pass 1 reads each layer's ``max |w|``; pass 2 is
    :func:`topometrics.features.loaded_weight_features`, the same code as
    :func:`topometrics.features.weight_features`, so the values equal it on the in-memory
    weights. Returns None (after a ``RuntimeWarning``) when a linear layer has NaN/Inf: the
    checkpoint has diverged.
    """
    absmax = {layer: where[tensor].absmax(tensor) for layer, tensor in layers.items()}  # pass 1
    if not np.isfinite(list(absmax.values())).all():
        return None
    global_max = max(absmax.values())
    loaders = {layer: functools.partial(where[tensor].read, tensor) for layer, tensor in layers.items()}
    return loaded_weight_features(loaders, global_max, params)  # pass 2, one layer at a time


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


def causal_lm_on_batch(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, layers: dict[str, str]
) -> tuple[np.ndarray, dict[str, float], float]:
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
    return states.reshape(-1, states.shape[-1]).double().numpy(), grads, float(loss.detach())


def model_features(ckpt: SeriesCheckpoint, layers: dict[str, str], text: str, params: FeaturesParams, seq_len: int):
    """Gradient norms, batch loss and representation topology on the fixed validation batch.

    The batch is ``features.rep_batch`` windows of ``seq_len`` tokens of the model's own
    tokenizer over the start of the validation text (:func:`topometrics.features.validation_batch`).
    When the model or tokenizer cannot be loaded, these rows are NULL with the reason.
    """
    try:
        model = load_causal_lm(ckpt)
        if ckpt.tokenizer_dir is None:
            raise OSError("no tokenizer files (tokenizer.json, tokenizer_config.json) beside the weights")
        tokenizer = AutoTokenizer.from_pretrained(ckpt.tokenizer_dir)
        ids = validation_tokens(tokenizer, text, params.rep_batch * seq_len + 1)
        x, y = validation_batch(ids, seq_len, params.rep_batch)
    except (OSError, ValueError, RuntimeError) as err:
        out = CheckpointFeatures()
        reason = f"model not loadable by transformers: {err}".splitlines()[0]
        for name in layers:
            out.add(name, dict.fromkeys(per_layer(GRADIENT), np.nan), reason)
        out.add(ALL, dict.fromkeys([*model_level(GRADIENT), *rep_feature_names(params)], np.nan), reason)
        return out
    states, grads, loss = causal_lm_on_batch(model, x, y, layers)
    out = CheckpointFeatures()
    for name, value in grads.items():
        out.add(name, {"grad_norm": value})
    out.add(ALL, {"grad_norm": np.sqrt(np.sum(np.square(list(grads.values())))), "batch_loss": loss})
    out.extend(representation_features(states, params))
    return out


def series_checkpoint_features(
    ckpt: SeriesCheckpoint, text: str, params: FeaturesParams, seq_len: int
) -> tuple[CheckpointFeatures, list[str]]:
    """All features of one checkpoint but the distances; also returns its layer names.

    Raises :class:`CheckpointError` (message naming the file) for an unreadable checkpoint; a
    diverged one gives NULLs with the reason, as in :func:`topometrics.features.checkpoint_features`.
    """
    where, layers = open_weights(ckpt.weights)
    weights = streamed_weight_features(where, layers, params)
    if weights is None:
        reason = "diverged: non-finite weights in a linear layer"
        warnings.warn(f"{ckpt.revision}: {reason}", RuntimeWarning, stacklevel=2)
        return null_features(len(layers) // len(NEOX_LINEAR), params, reason), list(layers)
    weights.extend(model_features(ckpt, layers, text, params, seq_len))
    return weights, list(layers)


# ---------------------------------------------------------------------------
# Resolving a series to checkpoints
# ---------------------------------------------------------------------------


def step_from_name(name: str) -> int | None:
    """The step in a name like ``step1000``, ``step_001000`` or ``checkpoint-1000`` (None if absent)."""
    match = _STEP_NAME.search(name)
    return int(match.group(1)) if match else None


def hub_checkpoints(model_id: str, revisions: tuple[str, ...], cache_dir: Path | None = None) -> Iterator:
    """Resolve hub revisions one at a time, in step order: yields SeriesCheckpoint or a skip dict.

    ``snapshot_download`` uses the cache first when offline (``HF_HUB_OFFLINE=1``) or when the hub
    cannot be reached; any failure to get the files is a skip with the reason.
    """
    steps = {revision: step_from_name(revision) for revision in revisions}
    for revision in [r for r in revisions if steps[r] is None]:
        yield _skip(revision, None, f"cannot tell the step of revision {revision!r}; name a step<N> branch")
    for revision in sorted((r for r in revisions if steps[r] is not None), key=steps.get):
        try:
            folder = Path(
                snapshot_download(model_id, revision=revision, allow_patterns=HUB_PATTERNS, cache_dir=cache_dir)
            )
        except (OSError, ValueError) as err:
            reason = f"not cached and not downloadable ({type(err).__name__}: {str(err).splitlines()[0]})"
            yield _skip(revision, steps[revision], reason)
            continue
        weights = tuple(sorted(folder.glob("*.safetensors")))
        if not weights:
            yield _skip(revision, steps[revision], f"{folder}: no .safetensors files (pickle weights are never loaded)")
            continue
        yield SeriesCheckpoint(steps[revision], revision, weights, _with(folder, "config.json"), _tokenizer_dir(folder))


def local_checkpoints(folder: Path) -> Iterator:
    """The checkpoints of a local folder, in step order: yields SeriesCheckpoint or a skip dict.

    Entries are sub-folders holding ``*.safetensors`` (``save_pretrained`` folders) and
    ``*.safetensors`` files directly in ``folder``. The step comes from the name (``step1000``,
    ``step_001000``, ``checkpoint-1000``), else from a sidecar ``<entry>.json`` with ``"step"``,
    else from ``trainer_state.json``'s ``global_step`` inside a folder. ``config.json`` and the
    tokenizer are taken from the entry's folder, else from ``folder`` itself.
    """
    folder = Path(folder)
    if not folder.is_dir():
        yield _skip(str(folder), None, f"{folder}: not a directory")
        return
    entries = [p for p in sorted(folder.iterdir()) if p.is_dir() and any(p.glob("*.safetensors"))]
    entries += sorted(folder.glob("*.safetensors"))
    found, seen = [], {}
    for entry in entries:
        step = _entry_step(entry)
        if step is None:
            yield _skip(entry.name, None, f"{entry}: cannot tell the step (name it step<N> or add {entry.stem}.json)")
            continue
        home = entry if entry.is_dir() else folder
        weights = tuple(sorted(entry.glob("*.safetensors"))) if entry.is_dir() else (entry,)
        config_dir = _with(home, "config.json") or _with(folder, "config.json")
        found.append(
            SeriesCheckpoint(step, entry.name, weights, config_dir, _tokenizer_dir(home) or _tokenizer_dir(folder))
        )
    for ckpt in sorted(found, key=lambda c: c.step):
        if ckpt.step in seen:
            yield _skip(ckpt.revision, ckpt.step, f"step {ckpt.step} already given by {seen[ckpt.step]}")
            continue
        seen[ckpt.step] = ckpt.revision
        yield ckpt


def _entry_step(entry: Path) -> int | None:
    step = step_from_name(entry.stem if entry.is_file() else entry.name)
    sidecars = [entry.with_suffix(".json") if entry.is_file() else entry.parent / f"{entry.name}.json"]
    for sidecar, key in ((sidecars[0], "step"), (entry / "trainer_state.json", "global_step")):
        if step is None and sidecar.is_file():
            value = json.loads(sidecar.read_text()).get(key)
            step = int(value) if value is not None else None
    return step


def _with(folder: Path, name: str) -> Path | None:
    return folder if (folder / name).is_file() else None


def _tokenizer_dir(folder: Path) -> Path | None:
    return folder if any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")) else None


def _skip(revision: str, step: int | None, reason: str) -> dict:
    return {"revision": revision, "step": step, "status": "skipped", "reason": reason}


def weights_sha256(files: tuple[Path, ...]) -> str | None:
    """The content hash of the weights when the HF cache names it (its blob is ``blobs/<sha256>``).

    Free for hub checkpoints; used to flag revisions that serve identical files (reported for some
    Pythia step branches, EleutherAI/pythia issue 205). None for local files.
    """
    blobs = [Path(os.path.realpath(p)) for p in files]
    if not all(b.parent.name == "blobs" for b in blobs):
        return None
    return ",".join(b.name for b in blobs)


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
            result.status.append(_skip(ckpt.revision, ckpt.step, str(err)))
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
