"""topometrics.series.checkpoint: what a series checkpoint's files hold, a config.json sized for another model, and
one forward and backward pass for both forward families of a transformers model."""

import pytest
import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

from tests.features.helpers import assert_shared_pass_equals_separate
from tests.repo_params import features_params
from topometrics.features.gradient_cloud import clouds_of, gradient_rows
from topometrics.series.checkpoint import causal_lm_on_batch, check_config_fits, checkpoint_shape, held_parameters
from topometrics.series.hub import SeriesCheckpoint

CONFIG = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=300)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("neox")
    model = GPTNeoXForCausalLM(GPTNeoXConfig(**CONFIG))
    model.save_pretrained(folder, safe_serialization=True)
    return folder, sum(p.numel() for p in model.parameters())


def test_the_files_hold_the_models_parameters_and_the_shape_is_its_configs(saved):
    folder, n_params = saved
    files = (folder / "model.safetensors",)
    assert held_parameters(files) == n_params
    shape = checkpoint_shape(SeriesCheckpoint(1, "step1", files, folder, None))
    assert shape == {"n_params": n_params, "hidden": 32, "layers": 2, "heads": 4, "vocab_size": 300,
                     "context": GPTNeoXConfig().max_position_embeddings}  # fmt: skip
    bare = checkpoint_shape(SeriesCheckpoint(1, "step1", files, None, None))
    assert bare == {"n_params": n_params} | dict.fromkeys(("hidden", "layers", "heads", "vocab_size", "context"))


def test_a_config_describing_a_much_larger_model_than_the_weights_is_refused_before_any_allocation(saved):
    folder, n_params = saved
    files = (folder / "model.safetensors",)
    check_config_fits(GPTNeoXConfig(**CONFIG), files)  # its own config fits
    huge = GPTNeoXConfig(**CONFIG | {"num_hidden_layers": 2000})  # counted on the meta device: no memory
    with pytest.raises(ValueError, match=rf"describes [\d,]+ parameters, its weights hold {n_params:,}$"):
        check_config_fits(huge, files)


def test_a_gpt_neox_shares_its_forward_pass_with_the_gradient_clouds_and_gets_the_same_values():
    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(GPTNeoXConfig(**CONFIG)).eval()
    passes = []
    model.gpt_neox.layers[0].register_forward_hook(lambda *_: passes.append(1))
    ids = torch.randint(0, 300, (4, 17), generator=torch.Generator().manual_seed(1))
    x, y = ids[:, :-1], ids[:, 1:]
    params = features_params(grad_batch=4, grad_dim=16)
    shared = causal_lm_on_batch(model, x, y, gradients=(x, y), clouds=clouds_of(params))
    layers = list(shared.grad_norms)
    shared_rows = gradient_rows(shared.gradients, layers, params)
    assert len(passes) == 1
    apart = causal_lm_on_batch(model, x, y, gradients=(x, y))
    apart_rows = gradient_rows(apart.gradients, layers, params)
    assert len(passes) == 3
    assert_shared_pass_equals_separate(shared, apart, shared_rows, apart_rows)
