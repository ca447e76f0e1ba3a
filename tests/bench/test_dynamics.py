"""The dynamics bench's memory machinery: the high-water mark resets, and the per-layer report's rows and bounds."""

import json
import subprocess
import sys
from pathlib import Path

import torch

from bench.dynamics import layer_memory, print_memory
from tests.repo_params import features_params
from topometrics.models.model import GPT, GPTConfig, count_parameters, linear_layer_names

# Run in a fresh process, as the bench measures each model: inside a test worker, memory other tests and threads
# hold or free at the same moment moves the high-water mark too (two failures in full runs at load 3-6).
HIGH_WATER = """
import json, sys, time
import numpy as np
sys.path.insert(0, {root!r})
from bench.dynamics import reset_peak, rss_kb
reset_peak()
entry = rss_kb()[1]
block = np.ones(8 << 20)  # 64 MiB written: resident
del block
seen = rss_kb()[1] - entry
for _ in range(40):  # RSS counts are folded in lazily: under load a reset can read a stale size
    reset_peak()
    now, peak = rss_kb()
    if peak - entry < 32 * 1024:
        break
    time.sleep(0.05)
print(json.dumps({{"seen": seen, "after": peak - entry, "gap": abs(peak - now)}}))
"""


def test_the_high_water_mark_is_lowered_to_the_resident_size_and_sees_a_block_allocated_in_between():
    script = HIGH_WATER.format(root=str(Path(__file__).resolve().parents[2]))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    kb = json.loads(done.stdout)
    assert kb["seen"] >= 60 * 1024  # the block was seen though it is gone
    assert kb["after"] < 32 * 1024 and kb["gap"] < 8 * 1024  # lowered: the block is no longer in it


def test_the_per_layer_report_has_a_row_per_linear_layer_with_its_bound(capsys):
    hidden, params = 16, features_params()
    config = GPTConfig(vocab_size=32, context=8, hidden=hidden, layers=2, heads=2)
    model = GPT(config)
    model.init_weights(torch.Generator().manual_seed(0))
    ids = torch.randint(32, (params.grad_batch, 9), generator=torch.Generator().manual_seed(1))
    found = layer_memory(model, ids[:, :-1], ids[:, 1:], params)
    rows = found["layers"]
    assert [row["layer"] for row in rows] == list(reversed(linear_layer_names(2)))  # backward order, each once
    shapes = {"attn.qkv": 3 * hidden * hidden, "attn.out": hidden * hidden, "mlp.in": 4 * hidden * hidden}
    shapes["mlp.out"] = 4 * hidden * hidden
    for row in rows:
        numel = shapes[row["layer"].split(".", 1)[1]]
        assert row["numel"] == numel
        assert row["bound_mb"] == round(params.grad_batch * numel * 4 / 2**20, 2)  # float32 weights
        assert abs(row["own_mb"] - (row["peak_mb"] - row["at_entry_mb"])) <= 0.011  # each rounded on its own
    assert found["grad_batch_x_largest_layer_mb"] == round(params.grad_batch * 4 * hidden * hidden * 4 / 2**20, 2)
    assert found["largest_own_mb"] == max(row["own_mb"] for row in rows)
    assert found["target_met"] == (found["largest_own_mb"] <= found["grad_batch_x_largest_layer_mb"])
    assert found["forward_backward"]["parameters_mb"] == round(count_parameters(model) * 4 / 2**20, 2)
    assert found["family_peak_mb"] >= max(row["peak_mb"] for row in rows) - 0.011
    assert all(p.grad is None for p in model.parameters())  # nothing left on the model
    print_memory("tiny", found)
    assert len(capsys.readouterr().out.splitlines()) == 2 + len(rows) + 2  # title, header, a line a layer, 2 totals


def test_models_are_named_comma_or_space_separated_and_the_pythia_shapes_are_gpt_neox_blocks():
    import pytest

    from bench.features import SURFACE_MODELS, model_names

    assert model_names(["pythia-70m-shaped,pythia-160m-shaped", "xl"]) == [
        "pythia-70m-shaped",
        "pythia-160m-shaped",
        "xl",
    ]
    with pytest.raises(SystemExit, match="unknown --models"):
        model_names(["pythia-70m-shaped,pythia-1b"])
    shapes = {name: (c.hidden, c.layers, c.heads, c.vocab_size) for name, c in SURFACE_MODELS.items()}
    assert shapes["pythia-160m-shaped"] == (768, 12, 12, 128) and shapes["pythia-410m-shaped"] == (1024, 24, 16, 128)
