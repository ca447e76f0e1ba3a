"""Per-example gradient clouds: vmap equals single-example backward passes, JL keeps distances, known answers."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from scipy.sparse.csgraph import minimum_spanning_tree
from scipy.spatial.distance import pdist, squareform

from topometrics.landscape.gradients import (
    cloud_summary,
    example_loss,
    gradient_topology,
    hookable_layers,
    jl_project,
    jl_tolerance,
    layer_gradients,
    linear_example_gradients,
    projection_columns,
)
from topometrics.measures.projection import CHUNK, project, workspace_bytes
from topometrics.models.architectures import module_layers
from topometrics.models.model import GPT, GPTConfig


def tiny_model() -> GPT:
    model = GPT(GPTConfig(vocab_size=32, context=8, hidden=16, layers=2, heads=2))
    model.init_weights(torch.Generator().manual_seed(0))
    return model.eval()


def batch(b: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(32, (b, 9), generator=torch.Generator().manual_seed(seed))
    return ids[:, :-1], ids[:, 1:]


def layer_map(model: GPT) -> dict[str, str]:
    return {layer.name: layer.tensor for layer in module_layers(model)}


def test_vmap_gradients_equal_single_example_backward_passes():
    model, (x, y) = tiny_model(), batch(3)
    params, names = dict(model.named_parameters()), list(layer_map(model).values())
    for name in (names[0], names[-1]):  # the first layer (attention's input) and the last (the MLP's output)
        got = layer_gradients(example_loss(model), params, name, x, y)
        for i in range(x.shape[0]):
            model.zero_grad(set_to_none=True)
            model.loss(x[i : i + 1], y[i : i + 1]).backward()
            expected = model.get_parameter(name).grad.reshape(-1).numpy()
            np.testing.assert_allclose(got[i], expected, atol=1e-6, rtol=0)


# one chunk a layer; 3 output rows a chunk; 1/16 of a layer a chunk (its share, however large CHUNK_VALUES)
@pytest.mark.parametrize(("chunk", "share"), [(1 << 20, 1), (5 * 16 * 3, 1), (1 << 20, 16)])
def test_one_batched_pass_gives_every_linear_layers_per_example_gradients_as_vmap_does(monkeypatch, chunk, share):
    import topometrics.landscape.clouds as C

    monkeypatch.setattr(C, "BLOCK_VALUES", chunk)
    monkeypatch.setattr(C, "LAYER_SHARE", share)
    model, (x, y) = tiny_model(), batch(5)
    params, layers = dict(model.named_parameters()), layer_map(model)
    hooked = hookable_layers(model, layers)
    assert set(hooked) == set(layers)  # our GPT's linear layers are all nn.Linear, none tied
    got = {}
    linear_example_gradients(model, hooked, x, y, lambda layer, chunks: got.__setitem__(layer, [*chunks()]))
    got = {layer: np.concatenate(parts, axis=1) for layer, parts in got.items()}
    assert list(got) == list(reversed(layers))  # the backward pass reaches the last layer first
    for layer, name in layers.items():
        np.testing.assert_allclose(got[layer], layer_gradients(example_loss(model), params, name, x, y), atol=1e-6)
    assert all(p.grad is None for p in model.parameters())  # nothing left behind on the model


def test_the_batched_pass_leaves_the_models_gradients_alone_and_serves_a_layer_without_bias():
    model, (x, y) = tiny_model(), batch(4)
    layers = layer_map(model)
    for p in model.parameters():
        p.grad = torch.full_like(p, 7.0)  # a caller's gradients: the weights' batch gradients are not computed
    linear_example_gradients(model, hookable_layers(model, layers), x, y, lambda layer, chunks: [*chunks()])
    assert all(torch.equal(p.grad, torch.full_like(p, 7.0)) for p in model.parameters())
    first = next(iter(layers))
    model.get_submodule(layers[first].rpartition(".")[0]).bias = None  # no bias: a whole backward pass instead
    model.zero_grad(set_to_none=True)
    got = {}
    linear_example_gradients(
        model, hookable_layers(model, layers), x, y, lambda layer, chunks: got.__setitem__(layer, [*chunks()])
    )
    assert set(got) == set(layers) and all(p.grad is None for p in model.parameters())
    params = dict(model.named_parameters())
    for layer in (first, list(layers)[-1]):
        expected = layer_gradients(example_loss(model), params, layers[layer], x, y)
        np.testing.assert_allclose(np.concatenate(got[layer], axis=1), expected, atol=1e-6)


def test_the_features_are_the_same_through_the_batched_pass_and_through_vmap():
    model, (x, y) = tiny_model(), batch(6)
    params, layers = dict(model.named_parameters()), layer_map(model)
    batched = gradient_topology(example_loss(model), params, layers, x, y, 8, 0, model)
    looped = gradient_topology(example_loss(model), params, layers, x, y, 8, 0)
    assert list(batched) == list(looped) == [*layers, "all"]
    for layer in looped:
        for key, value in looped[layer].items():
            assert batched[layer][key] == pytest.approx(value, rel=1e-4, abs=1e-7), (layer, key)


def test_a_weight_tied_to_another_name_is_not_served_by_the_batched_pass():
    model = tiny_model()
    layers = layer_map(model)
    first = next(iter(layers))
    module = model.get_submodule(layers[first].rpartition(".")[0])
    model.tied = torch.nn.Linear(module.in_features, module.out_features)
    model.tied.weight = module.weight  # one tensor under two names: its gradient has two uses
    assert first not in hookable_layers(model, layers) and len(hookable_layers(model, layers)) == len(layers) - 1
    assert hookable_layers(None, layers) == {}


def test_jl_projection_keeps_pairwise_distances_within_its_stated_tolerance():
    rng = np.random.default_rng(0)
    points = rng.normal(size=(20, 3000)) * rng.uniform(0.1, 10.0, size=(20, 1))
    k = 1024
    eps = jl_tolerance(20, k)
    assert 0 < eps < 0.25
    ratio = pdist(jl_project([points], k, seed=3)) ** 2 / pdist(points) ** 2
    assert np.all(np.abs(ratio - 1.0) <= eps)
    assert jl_tolerance(32, 64) == np.inf  # 64 dimensions promise nothing for 32 points at 95 %


def test_jl_projection_of_blocks_is_the_projection_of_their_concatenation():
    rng = np.random.default_rng(1)
    points = rng.normal(size=(6, CHUNK + 500)).astype(np.float32)
    whole = jl_project([points], 16, seed=5)
    parts = jl_project([points[:, :700], points[:, 700:]], 16, seed=5)
    np.testing.assert_allclose(parts, whole, rtol=1e-10, atol=1e-9)
    np.testing.assert_allclose(whole, project(points, 16, 5), rtol=1e-12, atol=1e-12)
    assert not np.allclose(jl_project([points], 16, seed=6), whole)


def test_a_layers_projection_indices_are_a_fraction_of_its_per_example_gradients():
    for numel in (1, 100, 2304, 9216, 1 << 20):  # one weight, xl's layers, a Pythia-70m MLP layer
        cloud_float32 = 16 * numel * 4  # bytes of 16 examples' gradients, whole
        columns = projection_columns(16, numel, 64)
        assert columns * workspace_bytes(64) <= max(workspace_bytes(64), cloud_float32 // 4)
    assert projection_columns(16, 1 << 20, 64) == CHUNK


def test_around_runs_once_around_each_layer_and_changes_nothing():
    model, (x, y) = tiny_model(), batch(4)
    params, layers = dict(model.named_parameters()), layer_map(model)
    seen = []

    @contextlib.contextmanager
    def around(layer):
        seen.append(layer)
        yield

    watched = gradient_topology(example_loss(model), params, layers, x, y, 8, 0, model, around)
    assert seen == list(reversed(layers))  # the batched pass: the backward pass reaches the last layer first
    assert watched == gradient_topology(example_loss(model), params, layers, x, y, 8, 0, model)
    seen.clear()
    gradient_topology(example_loss(model), params, layers, x, y, 8, 0, None, around)
    assert seen == list(layers)  # torch.func: in network order


def test_identical_examples_are_one_point():
    model = tiny_model()
    x, y = batch(1)
    x, y = x.repeat(4, 1), y.repeat(4, 1)
    out = gradient_topology(example_loss(model), dict(model.named_parameters()), layer_map(model), x, y, 8, 0)
    assert set(out) == {*layer_map(model), "all"}
    for features in out.values():
        assert features["tp0"] == 0.0 and features["tp1"] == 0.0 and features["unit_tp0"] == 0.0
        assert features["noise_scale"] == pytest.approx(0.0, abs=1e-9)
        assert features["mean_cosine"] == pytest.approx(1.0, abs=1e-6)


def test_a_layers_features_are_its_clouds_persistence_and_the_whole_networks_moments_are_exact():
    model, (x, y) = tiny_model(), batch(4)
    params, layers = dict(model.named_parameters()), layer_map(model)
    out = gradient_topology(example_loss(model), params, layers, x, y, 8, 0)
    grads = [layer_gradients(example_loss(model), params, name, x, y).astype(np.float64) for name in layers.values()]
    tree = minimum_spanning_tree(squareform(pdist(grads[0])))  # H0 deaths of a Rips filtration: the MST's edges
    assert out[next(iter(layers))]["tp0"] == pytest.approx(tree.sum(), rel=1e-9)
    whole = np.concatenate(grads, axis=1)
    mean = whole.mean(axis=0)
    expected = np.trace(np.cov(whole, rowvar=False)) / (mean @ mean)
    assert out["all"]["noise_scale"] == pytest.approx(expected, rel=1e-6)
    assert out["all"]["tp0"] > 0 and np.isfinite(out["all"]["unit_tp0"])
    # the whole network's cloud: the layers' gradients concatenated in network order, projected at once (the
    # family projects each layer's chunks at their offsets, layers in backward order)
    projected = cloud_summary(jl_project([whole], 8, 0))
    batched = gradient_topology(example_loss(model), params, layers, x, y, 8, 0, model)
    for key, value in projected.items():
        assert out["all"][key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
        assert batched["all"][key] == pytest.approx(value, rel=1e-4, abs=1e-7), key


def test_a_batch_of_one_is_refused():
    model, (x, y) = tiny_model(), batch(1)
    with pytest.raises(ValueError, match="at least 2"):
        gradient_topology(example_loss(model), dict(model.named_parameters()), layer_map(model), x, y, 8, 0)
