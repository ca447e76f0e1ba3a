"""The GPT ladder: exact parameter counts (paper Table 1), causality, and learning."""

import os
import subprocess
import sys

import pytest
import torch

from topometrics.models.model import (
    GPT,
    GPTConfig,
    count_parameters,
    gpt_on,
    linear_layer_names,
    linear_modules,
    linear_weights,
    step_memory_bytes,
)

TABLE_1 = {  # (hidden, layers, heads) -> parameters, from the paper's Table 1
    (8, 1, 1): 2_936,
    (16, 1, 2): 7_408,
    (24, 2, 2): 20_640,
    (32, 3, 4): 46_368,
    (48, 3, 4): 97_200,
}


def make(hidden=8, layers=1, heads=1, seed=0, context=128) -> GPT:
    model = GPT(GPTConfig(hidden=hidden, layers=layers, heads=heads, context=context))
    model.init_weights(torch.Generator().manual_seed(seed))
    return model


@pytest.mark.parametrize(("shape", "expected"), TABLE_1.items())
def test_parameter_counts_equal_table_1(shape, expected):
    assert count_parameters(make(*shape)) == expected


def test_the_loss_and_its_states_come_from_one_forward_pass_and_equal_the_separate_ones():
    model = make(16, 2, 2)
    x, y = torch.randint(0, 128, (3, 12)), torch.randint(0, 128, (3, 12))
    loss, states = model.loss_and_states(x, y)
    assert states.requires_grad  # in the graph: the loss's backward pass runs through them
    with torch.no_grad():
        assert torch.equal(states.detach(), model.hidden_states(x))
        logits = model(x)
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 128), y.reshape(-1))
    assert torch.equal(loss.detach(), expected) and torch.equal(model.loss(x, y).detach(), expected)


def test_head_is_tied_to_token_embedding():
    model = make(16, 1, 2)
    x = torch.randint(0, 128, (2, 10))
    manual = model.ln_f(model.hidden_states(x)) @ model.tok_emb.weight.T
    torch.testing.assert_close(model(x), manual)


def test_a_gpt_on_a_state_runs_on_its_tensors_gives_the_copied_models_logits_and_rejects_a_missing_one():
    source = make(16, 1, 2)
    state = {k: v.detach().clone() for k, v in source.state_dict().items()}
    model = gpt_on(state, source.cfg)
    # every parameter is the state's tensor itself: the weights are held once (the head is the token embedding)
    assert all(p.data_ptr() == state[name].data_ptr() for name, p in model.named_parameters())
    assert all(p.requires_grad and p.device.type == "cpu" for p in model.parameters())  # nothing left on meta
    x = torch.randint(0, 128, (2, 10))
    assert torch.equal(model(x), source(x))
    del state["ln_f.bias"]
    with pytest.raises(RuntimeError, match="ln_f.bias"):
        gpt_on(state, source.cfg)


def test_changing_a_future_token_leaves_earlier_logits_unchanged():
    model = make(24, 2, 2).eval()
    x = torch.randint(0, 128, (3, 40), generator=torch.Generator().manual_seed(1))
    y = x.clone()
    y[:, 25] = (y[:, 25] + 7) % 128
    with torch.no_grad():
        a, b = model(x), model(y)
    torch.testing.assert_close(a[:, :25], b[:, :25], rtol=0, atol=0)
    assert not torch.allclose(a[:, 25:], b[:, 25:])


def test_a_training_step_lowers_the_loss_on_a_fixed_batch():
    model = make(16, 1, 2)
    x = torch.randint(0, 128, (8, 32), generator=torch.Generator().manual_seed(2))
    y = torch.roll(x, -1, dims=1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    before = model.loss(x, y)
    before.backward()
    opt.step()
    with torch.no_grad():
        assert model.loss(x, y).item() < before.item()


def test_initialisation_is_a_pure_function_of_the_seed():
    a, b, c = make(seed=3), make(seed=3), make(seed=4)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    assert not torch.equal(a.blocks[0].attn.qkv.weight, c.blocks[0].attn.qkv.weight)


def test_linear_layers_are_named_in_network_order_with_out_by_in_shapes():
    model = make(24, 2, 2)
    weights = linear_weights(model.state_dict(), 2)
    assert list(weights) == linear_layer_names(2) == list(linear_modules(model))
    assert list(weights)[:4] == ["block0.attn.qkv", "block0.attn.out", "block0.mlp.in", "block0.mlp.out"]
    assert weights["block1.attn.qkv"].shape == (72, 24)
    assert weights["block1.mlp.in"].shape == (96, 24)
    assert weights["block1.mlp.out"].shape == (24, 96)


def test_sequence_longer_than_context_is_rejected():
    with pytest.raises(ValueError, match="exceeds the model context 16"):
        make(context=16)(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize(
    ("kwargs", "message"), [({"hidden": 10, "heads": 4}, "not divisible"), ({"layers": 0}, "positive")]
)
def test_invalid_config_is_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**kwargs)


STEP_PEAK = """
import sys, torch
from pathlib import Path
from topometrics.models.model import GPT, GPTConfig
def kib(field):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(field))
torch.set_num_threads(1)
batch, hidden, layers, heads = map(int, sys.argv[1:])
model = GPT(GPTConfig(hidden=hidden, layers=layers, heads=heads, context=128))
x, y = torch.randint(0, 128, (batch, 128)), torch.randint(0, 128, (batch, 128))
before = kib("VmRSS:")
Path("/proc/self/clear_refs").write_text("5")  # resets the peak (VmHWM) to now: import-time peaks do not count
model.loss(x, y).backward()
print((kib("VmHWM:") - before) * 1024)
"""


@pytest.mark.parametrize(("batch", "hidden", "layers", "heads"), [(256, 48, 3, 4), (1024, 8, 1, 1)])
def test_the_step_memory_estimate_is_a_lower_bound_of_the_measured_peak(batch, hidden, layers, heads):
    import subprocess
    import sys

    shape = [str(v) for v in (batch, hidden, layers, heads)]
    peak = int(subprocess.run([sys.executable, "-c", STEP_PEAK, *shape], capture_output=True, text=True,
                              check=True, timeout=120).stdout)  # fmt: skip
    estimate = step_memory_bytes(GPTConfig(hidden=hidden, layers=layers, heads=heads, context=128), batch)
    assert 0.5 * peak < estimate <= peak  # never refuses a batch that fits, and not far below what it needs


def test_the_residual_switch_leaves_default_metadata_unchanged_and_rebuilds_a_model_without_skips(tmp_path):
    import json

    from topometrics.models.checkpoints import list_checkpoints, save_checkpoint

    default = GPTConfig(hidden=8, layers=1, heads=2)
    assert default.to_dict() == {"vocab_size": 128, "context": 128, "hidden": 8, "layers": 1, "heads": 2}
    plain = GPTConfig(hidden=8, layers=1, heads=2, residual=False)
    assert GPTConfig(**plain.to_dict()) == plain and GPTConfig(**default.to_dict()) == default
    model = GPT(plain)
    model.init_weights(torch.Generator().manual_seed(0))
    assert model.state_dict().keys() == GPT(default).state_dict().keys()  # the same tensors, wired differently
    save_checkpoint(tmp_path, model, {"step": 0, "config": plain.to_dict()})
    rebuilt = GPT(list_checkpoints(tmp_path)[0].config)
    rebuilt.load_state_dict(model.state_dict())
    x = torch.randint(0, 128, (2, 8))
    block = model.blocks[0]
    h = model.tok_emb(x) + model.pos_emb(torch.arange(8))
    torch.testing.assert_close(rebuilt.hidden_states(x), block.mlp(block.ln2(block.attn(block.ln1(h)))))
    assert "residual" not in json.dumps(default.to_dict())


def test_deterministic_kernels_are_set_for_cuda_only_and_warn_rather_than_stop():
    # process-wide settings: checked in a fresh interpreter, so no other test runs under them
    script = (
        "import os, torch\n"
        "from topometrics.models.model import deterministic_on\n"
        "deterministic_on(torch.device('cpu'))\n"
        "print(torch.are_deterministic_algorithms_enabled(), os.environ.get('CUBLAS_WORKSPACE_CONFIG'))\n"
        "deterministic_on(torch.device('cuda'))\n"  # sets flags only: no CUDA device is needed for that
        "print(torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),"
        " os.environ.get('CUBLAS_WORKSPACE_CONFIG'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.splitlines() == ["False None", "True True :4096:8"]
