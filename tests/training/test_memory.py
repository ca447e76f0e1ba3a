"""topometrics.training.memory: a step too large for memory is refused before any work, or named when it fails."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.training.helpers import TRAIN, VAL, config, config_with_batch, quiet
from topometrics.params import ParamsError
from topometrics.training.train import (
    train_run,
)

ROOT = str(Path(__file__).resolve().parents[2])  # the repository: scripts run here import tests.<folder>.helpers


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_batch_too_large_for_memory_is_refused_before_the_run_directory_is_touched(tmp_path):
    torch.set_num_threads(1)
    train_run(config(steps=20), TRAIN, VAL, tmp_path, "sha", "cpu", quiet)
    before = snapshot(tmp_path)
    message = (r"^train\.batch_size=100000000: one training step of t-7 needs at least [\d.]+ GiB "
               r"\(100,000,000 windows of 32 characters\), more than the [\d.]+ GiB free; lower it$")  # fmt: skip
    with pytest.raises(ParamsError, match=message):
        train_run(config_with_batch(10**8), TRAIN, VAL, tmp_path, "sha", "cpu", quiet)
    assert snapshot(tmp_path) == before


OUT_OF_MEMORY = """
import resource, sys, torch
sys.path.insert(0, {repo!r})  # the repository, for tests.<folder>.helpers
torch.set_num_threads(1)
from tests.training.helpers import TRAIN, VAL, config, config_with_batch, quiet
from topometrics.errors import run_stage
from topometrics.training.train import train_run

with open("/proc/self/status") as f:  # the address space in use now, plus 256 MiB: the step's logits cannot fit
    used = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (used + 256 * 2**20, resource.RLIM_INFINITY))
run_stage(lambda argv: train_run(config_with_batch(40_000, lr=1e-3), TRAIN, VAL, {out!r}, "sha", "cpu", quiet), [])
"""


def test_a_new_recipe_whose_first_step_fails_leaves_the_finished_run_byte_identical(tmp_path):
    """Regression: a changed recipe discarded the finished run first, then failed at its first step (a batch
    too large gave a raw allocator error). Now the old files stay until the new recipe's step 0 has run; a
    real allocation failure (the address space capped) is one line naming the param."""
    torch.set_num_threads(1)
    train_run(config(steps=20), TRAIN, VAL, tmp_path, "sha", "cpu", quiet)
    before = snapshot(tmp_path)
    code = OUT_OF_MEMORY.format(repo=ROOT, out=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("error: train.batch_size=40000: a training step of t-7 ran out of memory (")
    assert proc.stderr.rstrip().endswith("; lower it (the run's finished files are kept)")
    assert len(proc.stderr.splitlines()) == 1 and "can't allocate memory" in proc.stderr
    assert snapshot(tmp_path) == before
