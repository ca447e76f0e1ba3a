"""topometrics.models.checkpoints: checkpoints listed by step, read back, and a changed or foreign one named."""

import json

import pytest
import torch

from topometrics.models.checkpoints import (
    CheckpointError,
    list_checkpoints,
    load_model,
    safetensors_problem,
    save_checkpoint,
    verify_checkpoint,
)
from topometrics.models.model import GPT, GPTConfig

CONFIG = GPTConfig(context=16, hidden=8, layers=1, heads=1)


def saved(run_dir, step: int, seed: int = 0, **meta) -> GPT:
    model = GPT(CONFIG)
    model.init_weights(torch.Generator().manual_seed(seed))
    own = {"step": step, "rung": "tiny", "seed": 42, "config": CONFIG.to_dict(), "recipe_fingerprint": "f" * 64}
    save_checkpoint(run_dir, model, own | meta)
    return model


def test_checkpoints_are_listed_by_step_and_load_back_the_saved_weights(tmp_path):
    models = {step: saved(tmp_path, step, seed=step) for step in (100, 0, 20)}
    (tmp_path / "step_000040.safetensors").write_bytes(b"")  # no sidecar: not complete, not listed
    found = list_checkpoints(tmp_path)
    assert [c.step for c in found] == [0, 20, 100] and [c.file_step for c in found] == [0, 20, 100]
    assert found[0].config == CONFIG and len(found[0].meta["sha256"]) == 64
    for ckpt in found:
        loaded = load_model(ckpt).state_dict()
        assert all(torch.equal(loaded[k], v) for k, v in models[ckpt.step].state_dict().items())
        assert verify_checkpoint(tmp_path, ckpt.step) is None


def test_a_flipped_byte_a_truncated_file_and_a_foreign_sidecar_are_named(tmp_path):
    for step in (0, 10, 20):
        saved(tmp_path, step)
    flipped = tmp_path / "step_000000.safetensors"
    data = bytearray(flipped.read_bytes())
    data[-1] ^= 0xFF  # the last weight byte: header and size whole
    flipped.write_bytes(bytes(data))
    assert verify_checkpoint(tmp_path, 0).startswith("step_000000.safetensors: content changed after it was written")
    truncated = tmp_path / "step_000010.safetensors"
    truncated.write_bytes(truncated.read_bytes()[:-4])
    assert safetensors_problem(truncated).startswith("truncated (")
    assert verify_checkpoint(tmp_path, 10).startswith("step_000010.safetensors: truncated (")
    sidecar = tmp_path / "step_000020.json"
    sidecar.write_text(json.dumps(json.loads(sidecar.read_text()) | {"seed": 7}))
    owner = {"rung": "tiny", "seed": 42, "variant": "base", "recipe_fingerprint": "f" * 64}
    assert verify_checkpoint(tmp_path, 20, owner).startswith("step_000020.json: a checkpoint of run tiny-7, not of")
    assert safetensors_problem(tmp_path / "absent.safetensors") == "missing"


def test_a_sidecar_that_is_not_json_is_one_error_naming_it(tmp_path):
    saved(tmp_path, 0)
    (tmp_path / "step_000000.json").write_text("{")
    with pytest.raises(CheckpointError, match=r"step_000000\.json: sidecar is not valid JSON"):
        list_checkpoints(tmp_path)
    assert verify_checkpoint(tmp_path, 0) == "step_000000.json: not valid JSON"
