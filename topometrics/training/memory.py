"""Whether a run's training step fits in memory: estimated before any work, named if the allocator still fails.

Too large a ``train.batch_size`` used to surface as a raw allocator error (after the run's finished
files were discarded). :func:`check_step_memory` refuses it before the run directory is touched, from
:func:`topometrics.models.model.step_memory_bytes` (a lower bound, so it never refuses a batch that
fits); :func:`out_of_memory_named` turns an allocator failure that still happens (several runs
share the memory, other processes take some) into one line naming the param and the fix.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from topometrics.models.model import GPTConfig, step_memory_bytes
from topometrics.params import BASE_VARIANT, ParamsError


def batch_key(variant: str) -> str:
    """Where a run's batch size is set in params.yaml: ``train.batch_size``, or its variant's override."""
    return "train.batch_size" if variant == BASE_VARIANT else f"variants.{variant}.batch_size (or train's)"


def check_step_memory(model: GPTConfig, batch_size: int, name: str, variant: str, device: torch.device) -> None:
    """:class:`ParamsError` when one training step of run ``name`` cannot fit in the memory free now."""
    need, free = step_memory_bytes(model, batch_size), free_memory_bytes(device)
    if free is not None and need > free:
        windows = f"{batch_size:,} windows of {model.context} characters"
        raise ParamsError(
            f"{batch_key(variant)}={batch_size}: one training step of {name} needs at least {need / 2**30:.1f} GiB "
            f"({windows}), more than the {free / 2**30:.1f} GiB free; lower it"
        )


def free_memory_bytes(device: torch.device) -> int | None:
    """Bytes free on ``device`` (:func:`available_ram_bytes` for the CPU; None where it cannot be told)."""
    return torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else available_ram_bytes()


def available_ram_bytes() -> int | None:
    """Linux's MemAvailable in bytes: what new allocations can take without swapping (None elsewhere)."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


@contextlib.contextmanager
def out_of_memory_named(batch_size: int, name: str, variant: str) -> Iterator[None]:
    """An allocator failure inside becomes a :class:`ParamsError` naming the batch size and the fix."""
    try:
        yield
    except RuntimeError as err:  # torch.OutOfMemoryError on CUDA; the CPU allocator raises a plain RuntimeError
        if not isinstance(err, torch.OutOfMemoryError) and "can't allocate memory" not in str(err):
            raise
        last = str(err).strip().splitlines()[-1][:200]
        raise ParamsError(
            f"{batch_key(variant)}={batch_size}: a training step of {name} ran out of memory ({last}); lower it "
            "(the run's finished files are kept)"
        ) from err
