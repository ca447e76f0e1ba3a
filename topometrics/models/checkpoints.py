"""Self-describing checkpoints: safetensors weights plus a small JSON sidecar.

A rung's run directory holds, for every checkpoint step ``s``::

    step_{s:06d}.safetensors   model state dict (see topometrics.models.model), float32
    step_{s:06d}.json          {"step", "rung", "seed", "config", "recipe_fingerprint",
                                "val_loss", "train_loss", "sha256"}

so any later stage rebuilds the model from the checkpoint alone. Nothing here ever
unpickles: safetensors stores raw tensors and JSON stores the rest. ``sha256`` is the weights
file's content hash: :func:`verify_checkpoint` checks it before a run is called complete, and the
features stage before it reads the weights (a flipped bit keeps the header and the size). A whole,
unchanged checkpoint can still be another run's (``cp small-42/step_000040.* tiny-42/``): its sidecar
must also describe the run directory it sits in and the step its file name says (:func:`foreign_problem`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from topometrics.atomic import file_sha256, write_bytes, write_text
from topometrics.errors import TopometricsError
from topometrics.models.model import GPT, GPTConfig, gpt_on
from topometrics.params import BASE_VARIANT, run_name

_STEP_FILE = re.compile(r"^step_(\d{6,})\.safetensors$")


class CheckpointError(TopometricsError, RuntimeError):
    """A checkpoint file is missing, truncated or inconsistent with its sidecar."""


@dataclass(frozen=True)
class Checkpoint:
    path: Path  # the .safetensors file
    meta: dict  # the sidecar

    @property
    def step(self) -> int:
        return int(self.meta["step"])

    @property
    def file_step(self) -> int:
        """The step its file name says (``step`` is its sidecar's: they differ only in a file renamed by hand)."""
        return int(self.path.stem.removeprefix("step_"))

    @property
    def config(self) -> GPTConfig:
        return GPTConfig(**self.meta["config"])


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / f"step_{step:06d}.safetensors"


def save_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> str:
    """Write tensors as a safetensors file atomically (contiguous CPU copies; nothing is pickled).

    Returns the sha256 of the bytes written (hashed in memory: no second read of the file).
    """
    data = save({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, metadata=metadata)
    write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


def save_checkpoint(run_dir: Path, model: GPT, meta: dict) -> Path:
    """Write weights, then the sidecar with their sha256; the sidecar's presence marks the checkpoint complete."""
    path = checkpoint_path(run_dir, meta["step"])
    digest = save_tensors(path, model.state_dict())
    write_sidecar(path, meta | {"sha256": digest})
    return path


def write_sidecar(path: Path, meta: dict) -> None:
    """The JSON sidecar of the checkpoint ``path`` (a ``.safetensors`` file), written atomically."""
    write_text(path.with_suffix(".json"), json.dumps(meta, indent=1, sort_keys=True))


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
            raise CheckpointError(
                f"{sidecar}: sidecar is not valid JSON ({err}); run `dvc repro` (training recomputes it)"
            ) from err
        found.append(Checkpoint(path, meta))
    return sorted(found, key=lambda c: c.step)


def safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file is not whole (missing, truncated, extended, bad header), or None.

    Cheap: reads the 8-byte header length and the JSON header only, and checks that the file
    ends exactly where the last tensor does.
    """
    path = Path(path)
    if not path.is_file():
        return "missing"
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 0 or 8 + n > size:
            return f"truncated ({size:,} bytes, shorter than its header)"
        try:
            header = json.loads(f.read(n))
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError):
            return "damaged header (not safetensors JSON)"
    if size != 8 + n + end:
        state = "truncated" if size < 8 + n + end else "longer than its tensors"
        return f"{state} ({size:,} bytes, its header says {8 + n + end:,})"
    return None


def run_owner(meta: dict) -> dict:
    """The run a sidecar or resume state describes: its rung, variant, seed and recipe fingerprint (a record
    written before variants is of the base variant)."""
    keys = ("rung", "seed", "recipe_fingerprint")
    return {k: meta.get(k) for k in keys} | {"variant": meta.get("variant", BASE_VARIANT)}


def foreign_problem(sidecar: str, meta: dict, step: int, owner: dict) -> str | None:
    """``<sidecar>: ...`` when the sidecar named ``sidecar``, of checkpoint ``step`` by its file name, describes
    another step, another run than ``owner`` (:func:`run_owner`) or another recipe; else None.

    Such a checkpoint was copied or moved in by hand: whole, and its hash its own sidecar's, so only this
    sees it. It is named with whose it is and never read as this run's checkpoint.
    """
    theirs, fix = run_owner(meta), "delete it (the train stage recomputes this run's)"
    if meta.get("step") != step:
        return f"{sidecar}: describes step {meta.get('step')!r}, not step {step} as its name says; {fix}"
    name, own = _label(theirs), _label(owner)
    if name != own:
        return f"{sidecar}: a checkpoint of run {name}, not of this run {own}; {fix}"
    if theirs["recipe_fingerprint"] != owner["recipe_fingerprint"]:
        fingerprints = f"{str(theirs['recipe_fingerprint'])[:12]}..., this run's {owner['recipe_fingerprint'][:12]}..."
        return f"{sidecar}: a checkpoint of run {name} made with another recipe ({fingerprints}); {fix}"
    return None


def _label(owner: dict) -> str:
    return run_name(str(owner["rung"]), owner["seed"], owner["variant"])


def verify_checkpoint(run_dir: Path, step: int, owner: dict | None = None) -> str | None:
    """Why checkpoint ``step`` of ``run_dir`` is not usable (``<file>: <reason>``), or None when whole, unchanged
    and, given the run's ``owner`` (:func:`run_owner`), this run's (:func:`foreign_problem`).

    Structure first (the sidecar, the safetensors header and size), then content: the weights'
    sha256 against the sidecar's (:func:`content_problem`). A sidecar written before checkpoints
    carried their hash has none; the hash of its structurally whole weights is recorded in it now
    (trust on first use: a finished run is never retrained for want of a hash, and any change
    after this first check is caught; docs/reliability.md).
    """
    path = checkpoint_path(run_dir, step)
    sidecar = path.with_suffix(".json")
    try:
        meta = json.loads(sidecar.read_text())
    except FileNotFoundError:
        return f"{sidecar.name}: missing"
    except (json.JSONDecodeError, UnicodeDecodeError):
        return f"{sidecar.name}: not valid JSON"
    if not isinstance(meta, dict):
        return f"{sidecar.name}: does not describe step {step}"
    if problem := foreign_problem(sidecar.name, meta, step, owner or run_owner(meta)):
        return problem
    problem = safetensors_problem(path)
    if problem:
        return f"{path.name}: {problem}"
    digest = file_sha256(path)
    if "sha256" not in meta:
        write_sidecar(path, meta | {"sha256": digest})
    return content_problem(path, meta.get("sha256"), digest)


def content_problem(path: Path, recorded: str | None, digest: str) -> str | None:
    """``<file>: ...`` when the sha256 ``digest`` of the weights ``path`` is not the ``recorded`` one, else None
    (also when nothing was recorded)."""
    if recorded is None or digest == recorded:
        return None
    hashes = f"sha256 {digest[:12]}..., its sidecar's {recorded[:12]}..."
    return f"{Path(path).name}: content changed after it was written ({hashes})"


def load_state(path: Path) -> dict[str, torch.Tensor]:
    """Tensors of a safetensors file, with a clear error for a corrupt or truncated one."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: checkpoint file is missing; run `dvc repro` (training recomputes it)")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(
            f"{path}: not a readable safetensors file ({err}); run `dvc repro` (training recomputes it)"
        ) from err


def load_model(ckpt: Checkpoint) -> GPT:
    """Rebuild the model from the checkpoint alone (config from the sidecar), on the file's own tensors (the
    weights held once, :func:`~topometrics.models.model.gpt_on`)."""
    state = load_state(ckpt.path)
    with torch.device("meta"):
        missing = set(GPT(ckpt.config).state_dict()) ^ set(state)
    if missing:
        raise CheckpointError(f"{ckpt.path}: tensors do not match the sidecar's config: {sorted(missing)[:5]}")
    return gpt_on(state, ckpt.config).eval()
