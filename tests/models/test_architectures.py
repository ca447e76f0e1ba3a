"""Canonical linear layers of any decoder: tiny random models of nine families, built here from
``transformers`` configs, saved with ``save_pretrained``, read back in memory and streamed."""

import json
import re

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM, MixtralConfig

from tests.models.helpers import module_weights
from tests.repo_params import features_params
from topometrics.features import checkpoint
from topometrics.models.architectures import (
    MAX_CONFIG_BYTES,
    PARTS,
    ArchitectureError,
    block_path,
    config_rules,
    match_tensors,
    module_layers,
    name_layers,
    oriented,
    rules_from_layers,
    user_rules,
)
from topometrics.models.model import GPT, GPTConfig, linear_layer_names, linear_weights
from topometrics.series.checkpoint import SafetensorsFile

D, FF, V = 32, 64, 128  # hidden, MLP width, vocabulary


COMMON = dict(hidden_size=D, num_hidden_layers=2, num_attention_heads=4, intermediate_size=FF, vocab_size=V)
CONFIGS = {
    "gpt2": dict(n_embd=D, n_layer=2, n_head=4, n_inner=FF, vocab_size=V, n_positions=64),
    "gpt_neox": COMMON,
    "llama": COMMON | {"num_key_value_heads": 2},
    "mistral": COMMON | {"num_key_value_heads": 2},
    "qwen2": COMMON | {"num_key_value_heads": 2},
    "olmo": COMMON,
    "olmo2": COMMON,
    "phi": COMMON,
    "phi3": COMMON | {"pad_token_id": 0},
}
KV = D // 4 * 2  # k and v rows with 2 key-value heads of width 8
# Written out by hand from each family's modeling code: canonical part -> (out, in) shape.
GATED = {"attn.q": (D, D), "attn.k": (KV, D), "attn.v": (KV, D), "attn.out": (D, D),
         "mlp.gate": (FF, D), "mlp.up": (FF, D), "mlp.down": (D, FF)}  # fmt: skip
EXPECTED = {
    "gpt2": {"attn.qkv": (3 * D, D), "attn.out": (D, D), "mlp.in": (FF, D), "mlp.out": (D, FF)},
    "gpt_neox": {"attn.qkv": (3 * D, D), "attn.out": (D, D), "mlp.in": (FF, D), "mlp.out": (D, FF)},
    "llama": GATED,
    "mistral": GATED,
    "qwen2": GATED,
    "olmo": GATED | {"attn.k": (D, D), "attn.v": (D, D)},
    "olmo2": GATED | {"attn.k": (D, D), "attn.v": (D, D)},
    "phi": {
        "attn.q": (D, D),
        "attn.k": (D, D),
        "attn.v": (D, D),
        "attn.out": (D, D),
        "mlp.in": (FF, D),
        "mlp.out": (D, FF),
    },
    "phi3": {"attn.qkv": (3 * D, D), "attn.out": (D, D), "mlp.in": (2 * FF, D), "mlp.out": (D, FF)},
}
PARAMS = features_params(max_points=20, workers=1)


def tiny(model_type: str, seed: int = 0) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **CONFIGS[model_type]))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return model.eval()


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def saved(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    model = tiny(request.param)
    model.save_pretrained(folder, safe_serialization=True)
    return request.param, model, folder


def streamed(folder) -> dict[str, np.ndarray]:
    shard = SafetensorsFile(folder / "model.safetensors")
    shapes = {name: tuple(shard.header[name]["shape"]) for name in shard.names}
    layers = match_tensors(shapes, config_rules(folder), str(folder))
    return {layer.name: oriented(shard.read(layer.tensor), layer.transposed) for layer in layers}


def test_module_tree_gives_the_canonical_layers_with_out_in_shapes(saved):
    family, model, _ = saved
    weights = module_weights(model)
    expected = [f"block{b}.{part}" for b in range(2) for part in EXPECTED[family]]
    assert sorted(weights) == sorted(expected)
    for name, w in weights.items():
        assert w.shape == EXPECTED[family][name.split(".", 1)[1]] and w.dtype == np.float32, name


def test_streamed_weights_equal_the_in_memory_weights_and_their_features(saved):
    _, model, folder = saved
    memory, files = module_weights(model), streamed(folder)
    assert list(files) == list(memory)  # same names, same order
    for name in memory:
        np.testing.assert_array_equal(files[name], memory[name])
    a, b = checkpoint.weight_features(memory, PARAMS), checkpoint.weight_features(files, PARAMS)
    assert a.rows == b.rows


def test_gpt2_conv1d_is_transposed_to_out_in():
    model = tiny("gpt2")
    stored = model.transformer.h[1].mlp.c_fc.weight.detach().numpy()  # Conv1D: (in, out)
    assert stored.shape == (D, FF)
    np.testing.assert_array_equal(module_weights(model)["block1.mlp.in"], stored.T)
    x = torch.randn(3, D, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # (out, in) means y = W x + b, as nn.Linear
        y = model.transformer.h[1].mlp.c_fc(x)
    w = torch.from_numpy(module_weights(model)["block1.mlp.in"])
    torch.testing.assert_close(y, x @ w.T + model.transformer.h[1].mlp.c_fc.bias)


def test_our_own_model_gets_the_names_of_the_features_tables():
    cfg = GPTConfig(hidden=16, layers=2, heads=2)
    model = GPT(cfg)
    assert [layer.name for layer in module_layers(model)] == linear_layer_names(2)
    for name, w in module_weights(model).items():
        np.testing.assert_array_equal(w, linear_weights(model.state_dict(), 2)[name])


def test_heads_and_embeddings_are_not_layers():
    tensors = {layer.tensor for layer in module_layers(tiny("llama"))}
    assert not any(t.startswith(("lm_head", "model.embed_tokens")) for t in tensors)
    assert len(tensors) == 2 * 7


def test_a_base_model_file_without_the_family_prefix_matches(tmp_path):
    model = tiny("gpt2")
    model.config.save_pretrained(tmp_path)
    base = {k.removeprefix("transformer."): v for k, v in model.state_dict().items() if k.startswith("transformer.")}
    shapes = {k: tuple(v.shape) for k, v in base.items()}
    layers = match_tensors(shapes, config_rules(tmp_path), "base")
    assert [layer.tensor for layer in layers[:2]] == ["h.0.attn.c_attn.weight", "h.0.attn.c_proj.weight"]


# ---------------------------------------------------------------------------
# Hand mapping and errors
# ---------------------------------------------------------------------------


def test_unknown_architecture_lists_the_2d_tensors_and_the_layers_option(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no_such_family", "hidden_size": 8}))
    with pytest.raises(ArchitectureError, match="no_such_family"):
        config_rules(tmp_path)
    shapes = {"enc.blk.0.wa.weight": (8, 8), "enc.blk.1.wa.weight": (8, 8), "enc.blk.0.wa.bias": (8,)}
    with pytest.raises(ArchitectureError) as err:
        match_tensors(shapes, config_rules_of("llama", tmp_path / "llama"), "ckpt.safetensors")
    message = str(err.value)
    assert message.startswith("ckpt.safetensors: unknown architecture, no tensor matches the layer rules.")
    assert "enc.blk.{i}.wa.weight (8, 8)" in message and "bias" not in message
    assert "layers: {attn.qkv:" in message and "\n" not in message


def config_rules_of(family, folder):
    folder.mkdir()
    tiny(family).config.save_pretrained(folder)
    return config_rules(folder)


def test_layers_option_maps_an_unknown_file_by_hand():
    shapes = {f"enc.blk.{b}.{m}.weight": (8, 4) for b in range(3) for m in ("wa", "wb")} | {"emb.weight": (10, 4)}
    rules = user_rules({"attn.qkv": r"enc\.blk\.(\d+)\.wa\.weight", "attn.out": r"enc\.blk\.(\d+)\.wb\.weight"})
    layers = match_tensors(shapes, rules, "x", every_rule=True)
    assert [(la.name, la.tensor) for la in layers[:3]] == [
        ("block0.attn.qkv", "enc.blk.0.wa.weight"),
        ("block0.attn.out", "enc.blk.0.wb.weight"),
        ("block1.attn.qkv", "enc.blk.1.wa.weight"),
    ]
    assert len(layers) == 6


@pytest.mark.parametrize(
    ("layers", "message"),
    [
        ({"attn.query": r"a\.(\d+)"}, "layers.attn.query: not a canonical part"),
        ({"attn.q": r"a\.(\d+"}, "layers.attn.q: 'a\\\\.(\\\\d+' is not a regular expression"),
        ({"attn.q": r"a\.\d+"}, "layers.attn.q: 'a\\\\.\\\\d+' needs exactly one group"),
    ],
)
def test_layers_option_mistakes_name_the_key(layers, message):
    with pytest.raises(ArchitectureError, match=re.escape(message)):
        user_rules(layers)


def test_layers_regex_matching_nothing_is_named():
    shapes = {"blk.0.wa.weight": (8, 4), "blk.1.wa.weight": (8, 4)}
    rules = user_rules({"attn.q": r"blk\.(\d+)\.wa\.weight", "attn.k": r"blk\.(\d+)\.wk\.weight"})
    with pytest.raises(ArchitectureError) as err:
        match_tensors(shapes, rules, "f", every_rule=True)
    assert str(err.value) == "f: layers.attn.k ('blk\\\\.(\\\\d+)\\\\.wk\\\\.weight') matches no 2-D tensor"


def test_incomplete_blocks_are_named():
    model = tiny("llama")
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items() if k != "model.layers.1.mlp.up_proj.weight"}
    with pytest.raises(ArchitectureError, match="incomplete blocks, block1.mlp.up is missing"):
        match_tensors(shapes, rules_from_layers(module_layers(model)), "ckpt")


def test_a_mixture_of_experts_block_is_not_silently_dropped():
    class Experts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(2))

    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList(Experts() for _ in range(2))
    with pytest.raises(ArchitectureError, match=r"no canonical part: layers.0.mlp.0 \(4, 4\)"):
        module_layers(model)


def test_fused_experts_and_a_custom_router_are_named_not_silently_dropped():
    # transformers 5 stores Mixtral's experts as 3-D parameters of one module and routes with a custom module:
    # no nn.Linear holds them, so only the attention layers would be read
    config = MixtralConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, num_local_experts=4,
                                        num_experts_per_tok=2, max_position_embeddings=64)  # fmt: skip
    model = AutoModelForCausalLM.from_config(config)
    fused = [n for n, p in model.named_parameters() if p.ndim == 3]
    assert fused, "this transformers version splits the experts: the test would test nothing"
    with pytest.raises(ArchitectureError) as err:
        module_layers(model)
    message = str(err.value)
    assert "block weights that are not linear layers (e.g. fused experts): " in message and "\n" not in message
    assert f"{fused[0]} {tuple(model.get_parameter(fused[0]).shape)}" in message
    assert "model.layers.0.mlp.gate.weight (4, 16)" in message  # the router, a custom module's matrix


def test_bare_state_dict_file_with_config_streams_like_save_pretrained(tmp_path):
    model = tiny("qwen2", seed=3)
    model.config.save_pretrained(tmp_path)
    save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"},
              str(tmp_path / "model.safetensors"))  # fmt: skip
    files = streamed(tmp_path)
    for name, w in module_weights(model).items():
        np.testing.assert_array_equal(files[name], w)


def test_without_a_config_tensor_names_are_classified_by_the_same_table():
    parts = [("attn.qkv", "attention.query_key_value"), ("attn.out", "attention.dense"),
             ("mlp.in", "mlp.dense_h_to_4h"), ("mlp.out", "mlp.dense_4h_to_h")]  # fmt: skip
    names = {f"gpt_neox.layers.{i}.{m}.{kind}": (4, 4) if kind == "weight" else (4,)
             for i in (1, 0) for _, m in parts for kind in ("weight", "bias")}  # fmt: skip
    layers = name_layers(names | {"gpt_neox.embed_in.weight": (9, 4)}, "f")
    assert [la.name for la in layers] == [f"block{i}.{part}" for i in (0, 1) for part, _ in parts]
    assert layers[-1].tensor == "gpt_neox.layers.1.mlp.dense_4h_to_h.weight" and not layers[-1].transposed
    with pytest.raises(ArchitectureError, match="incomplete blocks, block1.mlp.out is missing"):
        name_layers({k: v for k, v in names.items() if "1.mlp.dense_4h_to_h.weight" not in k}, "f")
    with pytest.raises(ArchitectureError, match=r"no canonical part for blocks.0.attn.mystery.weight"):
        name_layers({"blocks.0.attn.mystery.weight": (4, 4)}, "f")


@pytest.mark.parametrize(
    "names",
    [
        # a custom small GPT: attention's output `proj`, a tied head outside the blocks
        {"attn.qkv": "attn.qkv", "attn.proj": "attn.out", "mlp.fc1": "mlp.in", "mlp.fc2": "mlp.out"},
        # nanoGPT / minGPT
        {"attn.c_attn": "attn.qkv", "attn.c_proj": "attn.out", "mlp.c_fc": "mlp.in", "mlp.c_proj": "mlp.out"},
        # `proj` inside the MLP is its output; `fc` its input
        {"attn.qkv": "attn.qkv", "attn.out_proj": "attn.out", "mlp.fc": "mlp.in", "mlp.proj": "mlp.out"},
        # LLaMA's original names: w1 the gate, w3 the up projection, w2 back to the width
        {"attention.wq": "attn.q", "attention.wk": "attn.k", "attention.wv": "attn.v", "attention.wo": "attn.out",
         "feed_forward.w1": "mlp.gate", "feed_forward.w3": "mlp.up", "feed_forward.w2": "mlp.down"},
        {"attn.qkv": "attn.qkv", "attn.proj": "attn.out", "ff.w1": "mlp.gate", "ff.w3": "mlp.up", "ff.w2": "mlp.down"},
    ],
)  # fmt: skip
def test_common_small_gpt_names_are_recognised_without_a_layers_option(names):
    shapes = {f"layers.{i}.{name}.weight": (4, 4) for i in (0, 1) for name in names}
    shapes |= {"tok_emb.weight": (9, 4), "head.weight": (9, 4)}  # outside the blocks: not layers
    layers = name_layers(shapes, "f")
    order = sorted(set(names.values()), key=PARTS.index)
    assert [la.name for la in layers] == [f"block{i}.{part}" for i in (0, 1) for part in order]
    by_name = {la.name: la.tensor for la in layers}
    assert all(by_name[f"block1.{part}"] == f"layers.1.{name}.weight" for name, part in names.items())


def test_ff_is_a_whole_module_name_not_a_part_of_one():
    with pytest.raises(ArchitectureError, match="no canonical part for layers.0.diff.w1.weight"):
        name_layers({"layers.0.diff.w1.weight": (4, 4)}, "f")


def test_block_path():
    assert block_path("transformer.h.11.attn.c_attn.weight") == "transformer.h.11"
    assert block_path("model.decoder.layers.0.fc1.weight") == "model.decoder.layers.0"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"model_type": "gpt2", "n_layer": 10**7}, "config.json: n_layer=10000000 is not a layer count (1 to 1024)"),
        ({"model_type": "llama", "num_hidden_layers": "3"}, "num_hidden_layers='3' is not a layer count"),
        ('{"model_type": "gpt2", "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "not a JSON object (RecursionError)"),
        ("[1, 2]", "config.json is not a JSON object"),
        ('{"model_type": "gpt2", "pad": "' + "x" * (MAX_CONFIG_BYTES + 1) + '"}', "bytes, more than a config.json's"),
    ],
)
def test_a_config_json_with_sizes_no_model_has_is_refused_before_a_module_is_built(tmp_path, config, message):
    text = config if isinstance(config, str) else json.dumps(config)
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ArchitectureError, match=re.escape(message)):
        config_rules(tmp_path)
