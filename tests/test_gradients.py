"""Per-example gradient clouds: vmap equals single-example backward passes, JL keeps distances, known answers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.sparse.csgraph import minimum_spanning_tree
from scipy.spatial.distance import pdist, squareform

from topometrics.landscape.gradients import (
    PROJECTION_CHUNK,
    example_loss,
    gradient_topology,
    jl_project,
    jl_tolerance,
    layer_gradients,
    mean_cosine,
    noise_scale,
)
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
    points = rng.normal(size=(6, PROJECTION_CHUNK + 500)).astype(np.float32)
    whole = jl_project([points], 16, seed=5)
    parts = jl_project([points[:, :700], points[:, 700:]], 16, seed=5)
    np.testing.assert_allclose(parts, whole, rtol=1e-10, atol=1e-9)
    assert not np.allclose(jl_project([points], 16, seed=6), whole)


def test_noise_scale_and_cosine_against_their_definitions():
    g = np.random.default_rng(2).normal(size=(7, 40)) + 0.5
    mean = g.mean(axis=0)
    trace = np.trace(np.cov(g, rowvar=False))  # ddof 1, as McCandlish et al.'s estimator
    assert noise_scale(g @ g.T) == pytest.approx(trace / (mean @ mean), rel=1e-10)
    unit = g / np.linalg.norm(g, axis=1, keepdims=True)
    cos = unit @ unit.T
    assert mean_cosine(g @ g.T) == pytest.approx(cos[np.triu_indices(7, 1)].mean(), rel=1e-12)
    opposite = np.array([[1.0, 0.0], [-1.0, 0.0]])
    assert np.isnan(noise_scale(opposite @ opposite.T)) and mean_cosine(opposite @ opposite.T) == -1.0


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


def test_a_batch_of_one_is_refused():
    model, (x, y) = tiny_model(), batch(1)
    with pytest.raises(ValueError, match="at least 2"):
        gradient_topology(example_loss(model), dict(model.named_parameters()), layer_map(model), x, y, 8, 0)
