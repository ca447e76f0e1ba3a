"""Self-describing checkpoints: safetensors weights plus a small JSON sidecar.

A rung's run directory holds, for every checkpoint step ``s``::

    step_{s:06d}.safetensors   model state dict (see topometrics.model), float32
    step_{s:06d}.json          {"step", "rung", "seed", "config", "recipe_fingerprint",
                                "val_loss", "train_loss"}

so any later stage rebuilds the model from the checkpoint alone. Nothing here ever
unpickles: safetensors stores raw tensors and JSON stores the rest.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from topometrics.atomic import replacing, write_text
from topometrics.model import GPT, GPTConfig

_STEP_FILE = re.compile(r"^step_(\d{6,})\.safetensors$")


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, truncated or inconsistent with its sidecar."""


@dataclass(frozen=True)
class Checkpoint:
    path: Path  # the .safetensors file
    meta: dict  # the sidecar

    @property
    def step(self) -> int:
        return int(self.meta["step"])

    @property
    def config(self) -> GPTConfig:
        return GPTConfig(**self.meta["config"])


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / f"step_{step:06d}.safetensors"


def save_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """Write tensors as a safetensors file atomically (contiguous CPU copies; nothing is pickled)."""
    with replacing(path) as tmp:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp), metadata=metadata)


def save_checkpoint(run_dir: Path, model: GPT, meta: dict) -> Path:
    """Write weights, then the sidecar; the sidecar's presence marks the checkpoint complete."""
    path = checkpoint_path(run_dir, meta["step"])
    save_tensors(path, model.state_dict())
    write_text(path.with_suffix(".json"), json.dumps(meta, indent=1, sort_keys=True))
    return path


def list_checkpoints(run_dir: Path) -> list[Checkpoint]:
    """Complete checkpoints (weights and sidecar both present) sorted by step."""
    found = []
    for path in sorted(Path(run_dir).glob("step_*.safetensors")):
        sidecar = path.with_suffix(".json")
        if not _STEP_FILE.match(path.name) or not sidecar.exists():
            continue
        try:
            meta = json.loads(sidecar.read_text())
        except json.JSONDecodeError as err:
            raise CheckpointError(f"{sidecar}: sidecar is not valid JSON ({err}); delete it and re-run") from err
        found.append(Checkpoint(path, meta))
    return sorted(found, key=lambda c: c.step)


def load_state(path: Path) -> dict[str, torch.Tensor]:
    """Tensors of a safetensors file, with a clear error for a corrupt or truncated one."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: checkpoint file is missing; re-run training (dvc repro)")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(
            f"{path}: not a readable safetensors file ({err}); delete it and re-run training"
        ) from err


def load_model(ckpt: Checkpoint) -> GPT:
    """Rebuild the model from the checkpoint alone (config from the sidecar)."""
    model = GPT(ckpt.config)
    state = load_state(ckpt.path)
    missing = set(model.state_dict()) ^ set(state)
    if missing:
        raise CheckpointError(f"{ckpt.path}: tensors do not match the sidecar's config: {sorted(missing)[:5]}")
    model.load_state_dict(state)
    return model.eval()
