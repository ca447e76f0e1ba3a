"""Linear layers of any decoder, under one set of canonical names.

A decoder's linear layers are found in its module tree: every ``nn.Linear`` (and subclass) and
every ``transformers`` ``Conv1D`` (GPT-2, whose weight is stored ``(in, out)``) that sits inside a
numbered block (``transformer.h.3``, ``gpt_neox.layers.3``, ``model.layers.3``, ``blocks.3``).
Embeddings and the output head are outside the blocks and are left out, as for our own model.
Each layer is named ``block{i}.{part}`` by the module's last name and the block part it sits in
(attention or MLP):

==========  ==========================================================================
part        module names
==========  ==========================================================================
attn.q      q_proj, query, q, wq
attn.k      k_proj, key, k, wk
attn.v      v_proj, value, v, wv
attn.qkv    c_attn, query_key_value, qkv_proj, qkv, Wqkv, att_proj   (fused q, k, v)
attn.out    o_proj, out_proj, dense, c_proj, out, proj, wo           (inside attention)
mlp.gate    gate_proj, gate, w1                                      (LLaMA's w1: the gate)
mlp.up      up_proj, up, w3                                          (LLaMA's w3: the up projection)
mlp.down    down_proj, down, w2                                      (LLaMA's w2: back to the width)
mlp.in      c_fc, dense_h_to_4h, fc1, fc_in, fc, gate_up_proj        (fused gate and up)
mlp.out     c_proj, dense_4h_to_h, fc2, fc_out, proj                 (inside the MLP)
==========  ==========================================================================

Attention sits in a module whose name contains ``attn`` or ``attention``, the MLP in one containing
``mlp``, ``ffn``, ``ff`` or ``feed_forward`` (``layers.3.attn.proj``: attention's output;
``layers.3.mlp.proj``: the MLP's).

A block without ``mlp.gate`` is an ungated MLP, so its ``mlp.up``/``mlp.down`` are named
``mlp.in``/``mlp.out`` (our own ``blocks.{i}.mlp.up`` is ``block{i}.mlp.in``, as in the features
tables). Weights are always returned ``(out, in)``: row ``j`` holds output neuron ``j``'s weights.

For a safetensors file, the tensor-name rules of a family are derived from that same tree: the
model is built from ``config.json`` on PyTorch's ``meta`` device (no memory, no weights), its
layers are found as above, and each weight's name becomes a pattern with the block number as
``(\\d+)``. Architectures without such a tree, or with layers outside the table, are mapped by hand
with a ``layers:`` option: ``{part: regex}`` whose one group is the block number.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

# Canonical parts, in the order their layers are numbered inside a block (this order seeds
# the per-layer shuffled null, so it must not depend on how a file orders its tensors).
PARTS = ("attn.q", "attn.k", "attn.v", "attn.qkv", "attn.out", "mlp.gate", "mlp.up", "mlp.in", "mlp.down", "mlp.out")
_ATTN_LEAVES = {
    "attn.q": ("q_proj", "query", "q", "wq"),
    "attn.k": ("k_proj", "key", "k", "wk"),
    "attn.v": ("v_proj", "value", "v", "wv"),
    "attn.qkv": ("c_attn", "query_key_value", "qkv_proj", "qkv", "Wqkv", "att_proj"),
    "attn.out": ("o_proj", "out_proj", "dense", "c_proj", "out", "proj", "wo"),
}
_MLP_LEAVES = {
    "mlp.gate": ("gate_proj", "gate", "w1"),
    "mlp.up": ("up_proj", "up", "w3"),
    "mlp.down": ("down_proj", "down", "w2"),
    "mlp.in": ("c_fc", "dense_h_to_4h", "fc1", "fc_in", "fc", "gate_up_proj"),
    "mlp.out": ("c_proj", "dense_4h_to_h", "fc2", "fc_out", "proj"),
}
_ATTN = {leaf: part for part, leaves in _ATTN_LEAVES.items() for leaf in leaves}
_MLP = {leaf: part for part, leaves in _MLP_LEAVES.items() for leaf in leaves}
_ATTN_WORDS, _MLP_WORDS = ("attn", "attention"), ("mlp", "ffn", "feed_forward")
_MLP_NAMES = ("ff",)  # too short to look for inside a module name (diff_attn): the whole name only
_BLOCK_NUMBER = re.compile(r"\.(\d+)\.")
LAYERS_EXAMPLE = r"layers: {attn.qkv: 'blk\.(\d+)\.attn\.qkv\.weight', attn.out: 'blk\.(\d+)\.attn\.out\.weight', ...}"
LAYERS_FIX = "map the layers with the source's `layers:` option (docs/series.md, Any decoder)"


class ArchitectureError(ValueError):
    """No rule maps a model's or file's tensors onto the canonical linear layers."""


MAX_CONFIG_BYTES = 1 << 20  # a model's config.json is a few KB; a larger one is no configuration
# Layer counts a config.json may claim: the meta model builds one module per layer, so 10**7 would hang
# the stage building modules; the largest released decoders have about 130 layers.
MAX_LAYERS = 1024
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


@dataclass(frozen=True)
class LinearLayer:
    """One linear layer: canonical name, weight tensor name, and how the weight is stored."""

    name: str  # block{i}.{part}
    tensor: str  # state-dict key of the weight
    transposed: bool = False  # stored (in, out) (GPT-2's Conv1D): the (out, in) matrix is its transpose


@dataclass(frozen=True)
class TensorRule:
    """Tensor names of one canonical part: a pattern whose first group is the block number."""

    part: str
    pattern: str
    transposed: bool = False


# ---------------------------------------------------------------------------
# Module trees (in memory)
# ---------------------------------------------------------------------------


def module_layers(model: nn.Module) -> list[LinearLayer]:
    """The linear layers of a model's module tree, blocks in order, parts in :data:`PARTS` order.

    Raises
    ------
    ArchitectureError
        When no block holds a linear layer, or a block's linear layer has no canonical part
        (the message lists the unmapped modules and the ``layers:`` option).
    """
    found, unmapped = {}, []
    for path, module in model.named_modules():
        if not (isinstance(module, nn.Linear) or _is_conv1d(module)):
            continue
        where = _split_block(path)
        if where is None:
            continue  # outside the blocks: the head (or an adapter), not a layer of a block
        block, rel = where
        part = _part(rel)
        if part is None:
            unmapped.append(f"{path} {tuple(module.weight.shape)}")
            continue
        found[(block, part)] = LinearLayer("", f"{path}.weight", _is_conv1d(module))
    read = {layer.tensor for layer in found.values()}
    # A matrix of a block that no linear module owns (fused mixture-of-experts weights, 3-D, and their custom
    # routers in transformers 5) would be left out without a word: the block's measures would miss it.
    unread = [f"{n} {tuple(p.shape)}" for n, p in model.named_parameters()
              if p.ndim >= 2 and n not in read and _split_block(n) is not None]  # fmt: skip
    if unmapped or unread or not found:
        names = [f"{n} {tuple(p.shape)}" for n, p in model.named_parameters() if p.ndim == 2]
        why = (
            f"linear modules with no canonical part: {', '.join(unmapped)}" if unmapped
            else f"block weights that are not linear layers (e.g. fused experts): {', '.join(unread[:8])}" if unread
            else "no block layers"
        )  # fmt: skip
        raise ArchitectureError(unknown_architecture_message(type(model).__name__, names, why))
    return _ordered(found)


def oriented(weight: torch.Tensor | np.ndarray, transposed: bool) -> np.ndarray:
    """A stored weight as an ``(out, in)`` float32 array (a copy when it must convert or transpose)."""
    w = weight.cpu().float().numpy() if isinstance(weight, torch.Tensor) else np.asarray(weight, dtype=np.float32)
    return np.ascontiguousarray(w.T) if transposed else w


def _is_conv1d(module: nn.Module) -> bool:
    # Only transformers defines Conv1D; a model that has one was built with transformers imported.
    utils = sys.modules.get("transformers.pytorch_utils")
    return utils is not None and isinstance(module, utils.Conv1D)


def _split_block(path: str) -> tuple[int, list[str]] | None:
    """``transformer.h.3.attn.c_attn`` -> (3, ['attn', 'c_attn']); None outside numbered blocks."""
    parts = path.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return int(part), parts[i + 1 :]
    return None


def _part(rel: list[str]) -> str | None:
    if not rel or any(p.isdigit() for p in rel):
        return None  # nested numbering (experts of a mixture): not a plain block
    leaf, groups = rel[-1], [p.lower() for p in rel[:-1]]
    in_attn = any(w in g for g in groups for w in _ATTN_WORDS)
    in_mlp = any(w in g for g in groups for w in _MLP_WORDS) or any(g in _MLP_NAMES for g in groups)
    if in_attn and not in_mlp:
        return _ATTN.get(leaf)
    if in_mlp and not in_attn:
        return _MLP.get(leaf)
    if not groups:  # directly in the block (OPT's fc1/fc2): only a leaf that names one part
        candidates = {_ATTN.get(leaf), _MLP.get(leaf)} - {None}
        return candidates.pop() if len(candidates) == 1 else None
    return None


def _ordered(found: dict[tuple[int, str], LinearLayer]) -> list[LinearLayer]:
    """Canonical names, blocks in order and parts in PARTS order; ungated MLP up/down -> in/out."""
    blocks = sorted({block for block, _ in found})
    out = []
    for block in blocks:
        parts = {part: layer for (b, part), layer in found.items() if b == block}
        if "mlp.gate" not in parts:
            parts = {{"mlp.up": "mlp.in", "mlp.down": "mlp.out"}.get(p, p): layer for p, layer in parts.items()}
        for part in sorted(parts, key=PARTS.index):
            out.append(LinearLayer(f"block{block}.{part}", parts[part].tensor, parts[part].transposed))
    return out


# ---------------------------------------------------------------------------
# Tensor-name rules (streamed safetensors)
# ---------------------------------------------------------------------------


def rules_from_layers(layers: list[LinearLayer]) -> list[TensorRule]:
    """Per-part tensor-name patterns from a model's layers: the block number becomes ``(\\d+)``.

    The block container's leading names are optional (``(?:transformer\\.)?h\\.(\\d+)\\...``), so a
    file saved from the base model (``h.0.attn.c_attn.weight``) matches as well.
    """
    rules = {}
    for layer in layers:
        head, number, tail = _BLOCK_NUMBER.split(layer.tensor, maxsplit=1)
        *prefix, container = head.split(".")
        optional = f"(?:{re.escape('.'.join(prefix))}\\.)?" if prefix else ""
        pattern = f"^{optional}{re.escape(container)}\\.(\\d+)\\.{re.escape(tail)}$"
        part = layer.name.split(".", 1)[1]
        rules[(part, pattern)] = TensorRule(part, pattern, layer.transposed)
    return list(rules.values())


def config_rules(config_dir: Path) -> list[TensorRule]:
    """The tensor-name rules of the family in ``config_dir/config.json``, derived from its module tree.

    The model is built on the ``meta`` device (shapes only; nothing is allocated or downloaded,
    no remote code). Raises :class:`ArchitectureError` when ``transformers`` does not know the
    architecture or its tree has no canonical layers.
    """
    path = Path(config_dir) / "config.json"
    if (size := path.stat().st_size) > MAX_CONFIG_BYTES:
        raise ArchitectureError(f"{path}: {size:,} bytes, more than a config.json's {MAX_CONFIG_BYTES:,}")
    return list(_rules_for_config(path.read_text(errors="replace")))


@functools.lru_cache(maxsize=16)
def _rules_for_config(config_json: str) -> tuple[TensorRule, ...]:
    # transformers is imported here, not at module level: the in-memory path (the monitor inside a
    # training loop) needs only torch.
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        raw = json.loads(config_json)
    except (ValueError, RecursionError) as err:  # RecursionError: nested deeper than the parser goes
        raise ArchitectureError(f"config.json is not a JSON object ({type(err).__name__})") from err
    if not isinstance(raw, dict):
        raise ArchitectureError("config.json is not a JSON object")
    for key in _LAYER_KEYS:
        if key in raw and not (isinstance(raw[key], int) and 0 < raw[key] <= MAX_LAYERS):
            raise ArchitectureError(f"config.json: {key}={raw[key]!r} is not a layer count (1 to {MAX_LAYERS})")
    model_type = raw.get("model_type")
    try:
        config = AutoConfig.for_model(model_type, **{k: v for k, v in raw.items() if k != "model_type"})
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except (ValueError, KeyError, TypeError, AssertionError) as err:
        # transformers' own message for an unknown type lists every type it knows (12,000 characters): its start only
        why = (str(err).splitlines() or [type(err).__name__])[0][:100]
        raise ArchitectureError(
            f"config.json: transformers has no causal LM for model_type {repr(model_type)[:60]} ({why}...)"
        ) from err
    return tuple(rules_from_layers(module_layers(model)))


def user_rules(layers: Mapping[str, str], transposed: bool = False) -> list[TensorRule]:
    """Rules from a ``layers:`` option, ``{part: regex}`` with one group for the block number.

    Raises :class:`ArchitectureError` naming the key for an unknown part, a regex that does not
    compile, or one without exactly one group.
    """
    rules = []
    for part, pattern in layers.items():
        if part not in PARTS:
            raise ArchitectureError(f"layers.{part}: not a canonical part; use one of {', '.join(PARTS)}")
        try:
            groups = re.compile(pattern).groups
        except re.error as err:
            raise ArchitectureError(f"layers.{part}: {pattern!r} is not a regular expression ({err})") from err
        if groups != 1:
            raise ArchitectureError(f"layers.{part}: {pattern!r} needs exactly one group, the block number (\\d+)")
        rules.append(TensorRule(part, f"^(?:{pattern})$", transposed))
    return rules


def match_tensors(
    shapes: Mapping[str, tuple[int, ...]], rules: list[TensorRule], label: str, every_rule: bool = False
) -> list[LinearLayer]:
    """Map a file's tensors onto canonical layers with ``rules``.

    Parameters
    ----------
    shapes : {tensor name: shape}
        Every tensor of the checkpoint (all shards).
    rules : list of TensorRule
        From :func:`config_rules` or :func:`user_rules`.
    label : str
        The checkpoint, for messages.
    every_rule : bool
        Every rule must match a tensor (a ``layers:`` option: a regex matching nothing is a mistake).

    Raises
    ------
    ArchitectureError
        No rule matches (the message lists the 2-D tensors and the ``layers:`` option), a user
        rule matches nothing (``layers.<part>``), or a block lacks a part the others have.
    """
    found = {}
    compiled = [(rule, re.compile(rule.pattern)) for rule in rules]
    for name, shape in shapes.items():
        for rule, regex in compiled:
            match = regex.match(name)
            if match and len(shape) == 2:
                found[(int(match.group(1)), rule.part)] = LinearLayer("", name, rule.transposed)
    for rule in rules if every_rule else []:
        if not any(part == rule.part for _, part in found):
            raise ArchitectureError(f"{label}: layers.{rule.part} ({rule.pattern[4:-2]!r}) matches no 2-D tensor")
    if not found:
        two_d = [f"{n} {tuple(s)}" for n, s in shapes.items() if len(s) == 2]
        raise ArchitectureError(unknown_architecture_message(label, two_d, "no tensor matches the layer rules"))
    return _complete(found, label)


def name_layers(shapes: Mapping[str, tuple[int, ...]], label: str) -> list[LinearLayer]:
    """Without a config: the 2-D ``.weight`` tensors inside numbered blocks, named by the module table.

    The same classification as :func:`module_layers`, applied to tensor names; weights are read as
    stored, ``(out, in)`` (a GPT-2 Conv1D file needs its ``config.json`` to be read transposed).
    Raises :class:`ArchitectureError` listing the 2-D tensors when a block tensor has no part.
    """
    found, unmapped = {}, []
    for name, shape in shapes.items():
        where = _split_block(name.removesuffix(".weight")) if len(shape) == 2 and name.endswith(".weight") else None
        if where is None:
            continue
        part = _part(where[1])
        if part is None:
            unmapped.append(name)
            continue
        found[(where[0], part)] = LinearLayer("", name)
    if unmapped or not found:
        two_d = [f"{n} {tuple(s)}" for n, s in shapes.items() if len(s) == 2]
        why = f"no canonical part for {', '.join(unmapped[:4])}" if unmapped else "no 2-D weights in numbered blocks"
        raise ArchitectureError(unknown_architecture_message(label, two_d, why))
    return _complete(found, label)


def checkpoint_layers(
    shapes: Mapping[str, tuple[int, ...]], config_dir: Path | None, layers: Mapping[str, str] | None, label: str
) -> list[LinearLayer]:
    """A checkpoint's linear layers: by the ``layers:`` option if given, else by the rules of its
    ``config.json``'s family, else by tensor names (:func:`name_layers`).

    A ``config.json`` no rules come from (an unknown ``model_type``, a layer count no model has) is one short
    line naming it and the ``layers:`` option, which reads the file without it; the tensor list of
    :func:`unknown_architecture_message` is kept for files whose tensors the rules do not name."""
    if layers:
        return match_tensors(shapes, user_rules(layers), label, every_rule=True)
    if config_dir is None:
        return name_layers(shapes, label)
    try:
        rules = config_rules(config_dir)
    except ArchitectureError as err:
        raise ArchitectureError(f"{label}: unknown architecture, {err}; {LAYERS_FIX}") from err
    return match_tensors(shapes, rules, label)


def block_path(tensor: str) -> str:
    """The module path of the block holding a layer: ``transformer.h.3.attn.c_attn.weight`` -> ``transformer.h.3``."""
    head, number, _ = _BLOCK_NUMBER.split(tensor, maxsplit=1)
    return f"{head}.{number}"


def _complete(found: dict[tuple[int, str], LinearLayer], label: str) -> list[LinearLayer]:
    """Canonical order, after checking every block 0..n-1 has every part that any block has."""
    blocks = sorted({block for block, _ in found})
    parts = sorted({part for _, part in found}, key=PARTS.index)
    missing = [f"block{b}.{p}" for b in blocks for p in parts if (b, p) not in found]
    if missing or blocks != list(range(len(blocks))):
        gap = missing[0] if missing else f"block numbers {blocks[:8]}"
        raise ArchitectureError(f"{label}: incomplete blocks, {gap} is missing (+{max(len(missing) - 1, 0)})")
    return _ordered(found)


def unknown_architecture_message(label: str, two_d: list[str], why: str) -> str:
    """One line: what has no rule, the 2-D tensors (block numbers collapsed to ``{i}``), the fix."""
    seen = list(dict.fromkeys(_BLOCK_NUMBER.sub(".{i}.", name) for name in two_d))
    listed = ", ".join(seen[:24]) + (f" (+{len(seen) - 24} more)" if len(seen) > 24 else "")
    return (
        f"{label}: unknown architecture, {why}. Its 2-D tensors: {listed or 'none'}. "
        f"Map them by hand in the series source: {LAYERS_EXAMPLE} (parts: {', '.join(PARTS)})"
    )
