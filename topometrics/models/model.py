"""A small GPT-style language model over characters or byte-level BPE tokens (the paper's ladder, Table 1).

Pre-LayerNorm decoder blocks with causal self-attention and a 4x GELU MLP, learned
positional embeddings, biases everywhere, and an output head tied to the token
embedding (so the head adds no parameters and has no bias). With vocabulary 128 and
context 128 the parameter counts equal the paper's Table 1 exactly:

    hidden 8/1 layer -> 2,936   16/1 -> 7,408   24/2 -> 20,640   32/3 -> 46,368   48/3 -> 97,200

State-dict keys (also the checkpoint tensor names)::

    tok_emb.weight (V, d)           pos_emb.weight (T, d)
    blocks.{i}.ln1.weight/bias (d,)
    blocks.{i}.attn.qkv.weight (3d, d)   .bias (3d,)    # q, k, v stacked on rows
    blocks.{i}.attn.out.weight (d, d)    .bias (d,)
    blocks.{i}.ln2.weight/bias (d,)
    blocks.{i}.mlp.up.weight (4d, d)     .bias (4d,)
    blocks.{i}.mlp.down.weight (d, 4d)   .bias (d,)
    ln_f.weight/bias (d,)
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from topometrics.params_schema import ParamsError


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 128  # characters; id 127 stands for every non-ASCII character
    context: int = 128  # longest sequence the positional table covers
    hidden: int = 48  # width d of the residual stream
    layers: int = 3  # number of decoder blocks
    heads: int = 4  # attention heads; hidden must be divisible by heads
    residual: bool = True  # False: blocks without the skip connections (x = attn(ln1 x); x = mlp(ln2 x))

    def __post_init__(self) -> None:
        if not isinstance(self.residual, bool):
            raise ValueError(f"GPTConfig.residual must be true or false, got {self.residual!r}")
        for name in ("vocab_size", "context", "hidden", "layers", "heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {value!r}")
        if self.hidden % self.heads:
            raise ValueError(
                f"GPTConfig.hidden={self.hidden} is not divisible by heads={self.heads}; "
                "choose heads that divide hidden"
            )

    def to_dict(self) -> dict:
        """The fields as a dict; ``residual`` only when False, so a default model's checkpoint metadata is
        byte for byte what it was before the switch existed."""
        out = asdict(self)
        if self.residual:
            del out["residual"]
        return out


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.out = nn.Linear(cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)  # each (b, t, d)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, h, t, d/h)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.up = nn.Linear(cfg.hidden, 4 * cfg.hidden)
        self.down = nn.Linear(4 * cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.residual = cfg.residual
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.residual:
            return self.mlp(self.ln2(self.attn(self.ln1(x))))
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.pos_emb = nn.Embedding(cfg.context, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.hidden)

    def init_weights(self, generator: torch.Generator) -> None:
        """GPT-2 initialisation from an explicit generator: N(0, 0.02) for matrices and
        embeddings, residual output projections scaled by 1/sqrt(2 * layers), zero biases."""
        residual_std = 0.02 / math.sqrt(2 * self.cfg.layers)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif ".ln" in name or name.startswith("ln_f"):
                nn.init.ones_(p)
            else:
                std = residual_std if name.endswith(("attn.out.weight", "mlp.down.weight")) else 0.02
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=generator) * std)

    def hidden_states(self, idx: torch.Tensor) -> torch.Tensor:
        """(b, t) token ids -> (b, t, d) residual stream after the last block, before ln_f."""
        b, t = idx.shape
        if t > self.cfg.context:
            raise ValueError(f"sequence length {t} exceeds the model context {self.cfg.context}")
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return x

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """(b, t) token ids -> (b, t, vocab) logits; the head is the token embedding."""
        return self.head(self.hidden_states(idx))

    def head(self, states: torch.Tensor) -> torch.Tensor:
        """(b, t, d) residual stream -> (b, t, vocab) logits: ``ln_f``, then the token embedding."""
        return F.linear(self.ln_f(states), self.tok_emb.weight)

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.loss_and_states(idx, targets)[0]

    def loss_and_states(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The mean next-token cross-entropy of (b, t) ids against (b, t) targets and the (b, t, d) residual
        stream it was computed from (:meth:`hidden_states`, still in the graph): one forward pass for both."""
        states = self.hidden_states(idx)
        logits = self.head(states)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1)), states


def gpt_on(state: dict[str, torch.Tensor], cfg: GPTConfig) -> GPT:
    """Our GPT whose parameters are ``state``'s own tensors, not copies of them (``assign``): a caller that keeps
    the state while the model runs holds the weights once (a Pythia-410M shape's 1.2 GB); nothing that measures
    a checkpoint writes to its weights. Built on the meta device, so no initial weights are drawn or held beside
    the state even for a moment. Loaded strictly: a missing or unexpected tensor raises."""
    with torch.device("meta"):
        model = GPT(cfg)
    model.load_state_dict(state, assign=True)
    return model


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def step_memory_bytes(cfg: GPTConfig, batch_size: int) -> int:
    """A lower bound on the memory (bytes) one float32 training step of ``batch_size`` windows needs.

    The logits and their gradient (2 x batch x context x vocab) and what each block keeps for the
    backward pass (16 x batch x context x hidden; 18-20 measured on CPU, where PyTorch's fused
    attention keeps no context x context scores). The weights and AdamW's moments are small beside them.
    """
    tokens = batch_size * cfg.context
    return 4 * (2 * tokens * cfg.vocab_size + 16 * cfg.layers * tokens * cfg.hidden)


# Feature-facing layer names -> state-dict prefixes. Embeddings (a lookup table) and the head
# (tied to the token embedding: the same matrix) are not linear layers between neurons of the
# network graph, so the weight features leave them out.
_LINEAR_PARTS = {"attn.qkv": "attn.qkv", "attn.out": "attn.out", "mlp.in": "mlp.up", "mlp.out": "mlp.down"}


def linear_layer_names(layers: int) -> list[str]:
    """Names of the linear layers in network order, e.g. ``block0.attn.qkv``."""
    return [f"block{i}.{part}" for i in range(layers) for part in _LINEAR_PARTS]


def linear_weights(state: dict[str, torch.Tensor | np.ndarray], layers: int) -> dict[str, np.ndarray]:
    """The weight matrices of the linear layers, (out, in) float32 arrays, biases left out.

    Keys are :func:`linear_layer_names`; rows are output neurons, so row ``j`` holds
    neuron ``j``'s incoming weights.
    """
    out = {}
    for i in range(layers):
        for part, module in _LINEAR_PARTS.items():
            w = state[f"blocks.{i}.{module}.weight"]
            w = w.detach().cpu().numpy() if isinstance(w, torch.Tensor) else np.asarray(w)
            out[f"block{i}.{part}"] = w.astype(np.float32, copy=False)
    return out


def linear_modules(model: GPT) -> dict[str, nn.Linear]:
    """The same layers as :func:`linear_weights`, as modules (for gradients)."""
    return {
        f"block{i}.{part}": getattr(getattr(block, module.split(".")[0]), module.split(".")[1])
        for i, block in enumerate(model.blocks)
        for part, module in _LINEAR_PARTS.items()
    }


def deterministic_on(device: torch.device) -> None:
    """On CUDA, the kernels that make a run recompute bit-identically (a resumed run, a run moved to another worker):
    cuBLAS's fixed workspace (read when its handle is made, at the first product: so before it) and PyTorch's
    deterministic algorithms, process-wide (the memory-efficient attention's backward then takes its deterministic
    path; ``warn_only``: an op without one warns rather than stopping the run). The CPU's kernels already are."""
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)


def device_kind(requested: str) -> str:
    """``'cuda'`` or ``'cpu'``: where a params device (``auto``: CUDA when present, ``cpu`` or ``cuda``) sends the
    work, without checking that a requested CUDA is there (:func:`pick_device` does)."""
    return "cuda" if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()) else "cpu"


def free_gpu_bytes(kind: str) -> int | None:
    """The current CUDA device's free memory in bytes (``torch.cuda.mem_get_info``) when ``kind`` (a
    :func:`device_kind`) is ``'cuda'``; None on the CPU."""
    return torch.cuda.mem_get_info()[0] if kind == "cuda" else None


def pick_device(requested: str, key: str = "train.device") -> torch.device:
    """The torch device a params ``key`` (``auto``: CUDA when present, ``cpu`` or ``cuda``) names; a
    :class:`ParamsError` naming the key when it asks for CUDA and none is visible."""
    if requested == "cuda" and not torch.cuda.is_available():
        raise ParamsError(f"{key}=cuda but no CUDA device is visible; set {key}: auto or cpu")
    if requested == "auto":
        return torch.device(device_kind(requested))
    return torch.device(requested)
