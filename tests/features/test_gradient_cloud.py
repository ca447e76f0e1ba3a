"""The gradient_topology rows of a checkpoint, through the real forward pass of a tiny GPT."""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import pytest
import torch

from tests.features.helpers import assert_shared_pass_equals_separate
from tests.repo_params import features_params
from topometrics.features.checkpoint import checkpoint_features
from topometrics.features.forward import model_on_batch, validation_batch
from topometrics.features.gradient_cloud import clouds_of, gradient_batch, gradient_rows
from topometrics.models.model import GPT, GPTConfig, linear_layer_names
from topometrics.params import FeaturesParams
from topometrics.params_schema import ParamsError
from topometrics.vocabulary import ALL, GRADIENT_TOPOLOGY, model_level, per_layer

CONFIG = GPTConfig(context=8, hidden=8, layers=2, heads=2)
PARAMS = features_params(rep_points=30, rep_batch=4, betti_scales=4, workers=1, grad_batch=6, grad_dim=16)
OFF = "family switched off (features.families)"


def state(seed: int = 1) -> dict[str, torch.Tensor]:
    model = GPT(CONFIG)
    model.init_weights(torch.Generator().manual_seed(seed))
    return model.state_dict()


def family_rows(tokens: np.ndarray, params: FeaturesParams = PARAMS) -> dict[tuple[str, str], tuple[float, str]]:
    batch = validation_batch(tokens, CONFIG.context, params.rep_batch)
    grads = gradient_batch(tokens, CONFIG.context, params)
    rows = checkpoint_features(state(), CONFIG, batch, params, "no surface", None, grads).rows
    return {(layer, name): (value, why) for layer, name, value, why in rows if name.startswith("gt_")}


def random_tokens(n: int = 200) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 128, n).astype(np.uint8)


def test_the_family_has_its_declared_rows_for_every_linear_layer_and_all():
    rows = family_rows(random_tokens())
    layers = linear_layer_names(CONFIG.layers)
    expected = {(layer, name) for layer in layers for name in per_layer(GRADIENT_TOPOLOGY)}
    expected |= {(ALL, name) for name in model_level(GRADIENT_TOPOLOGY)}
    assert set(rows) == expected
    assert len(per_layer(GRADIENT_TOPOLOGY)) == 12 and len(model_level(GRADIENT_TOPOLOGY)) == 26
    assert all(np.isfinite(value) and why is None for value, why in rows.values())
    # 6 distinct examples: 5 finite H0 bars, a positive total; cosines of gradients of one loss lie in [-1, 1]
    assert rows[(ALL, "gt_net_tp0")][0] > 0 and rows[(ALL, "gt_noise_scale")][0] > 0
    assert -1 <= rows[(ALL, "gt_mean_cosine")][0] <= 1
    # layer 'all' of a per-layer feature is its declared aggregation (sum for tp0, max for maxpers1)
    assert rows[(ALL, "gt_tp0")][0] == pytest.approx(sum(rows[(layer, "gt_tp0")][0] for layer in layers))
    assert rows[(ALL, "gt_unit_maxpers1")][0] == max(rows[(layer, "gt_unit_maxpers1")][0] for layer in layers)


def test_identical_examples_are_one_point_with_no_persistence_and_no_noise():
    window = np.random.default_rng(1).integers(0, 128, CONFIG.context).astype(np.uint8)
    rows = family_rows(np.tile(window, 10))  # period = context: every window and its targets are the same
    for layer in [*linear_layer_names(CONFIG.layers), ALL]:
        assert rows[(layer, "gt_tp0")][0] == pytest.approx(0, abs=1e-6), layer
        assert rows[(layer, "gt_tp1")][0] == pytest.approx(0, abs=1e-6), layer
    assert rows[(ALL, "gt_net_tp0")][0] == pytest.approx(0, abs=1e-6)
    assert rows[(ALL, "gt_noise_scale")][0] == pytest.approx(0, abs=1e-6)
    assert rows[(ALL, "gt_mean_cosine")][0] == pytest.approx(1, abs=1e-6)


def test_a_batch_larger_than_the_split_is_null_with_the_reason():
    params = dataclasses.replace(PARAMS, grad_batch=30)
    reason = "features.grad_batch = 30 windows of 8 need 241 validation tokens, the split has 200"
    assert gradient_batch(random_tokens(), CONFIG.context, params) == reason
    rows = family_rows(random_tokens(), params)
    assert rows and all(np.isnan(value) and why == reason for value, why in rows.values())


def test_the_same_windows_at_every_checkpoint_are_the_first_of_the_split():
    x, y = gradient_batch(random_tokens(), CONFIG.context, PARAMS)
    vx, vy = validation_batch(random_tokens(), CONFIG.context, PARAMS.grad_batch)
    assert torch.equal(x, vx) and torch.equal(y, vy) and x.shape == (6, 8)


def test_switched_off_it_is_null_with_the_reason_and_the_others_still_run():
    families = tuple(f for f in PARAMS.families if f != "gradient_topology")
    rows = family_rows(random_tokens(), dataclasses.replace(PARAMS, families=families))
    assert rows and all(np.isnan(value) and why == OFF for value, why in rows.values())
    on = family_rows(random_tokens(), dataclasses.replace(PARAMS, families=("gradient_topology",)))
    assert all(np.isfinite(value) for value, _ in on.values())


def test_a_batch_too_small_for_a_loop_is_refused():
    with pytest.raises(ParamsError, match="grad_batch"):
        dataclasses.replace(PARAMS, grad_batch=3).check()


def test_one_forward_and_backward_pass_serves_both_families_when_their_batches_are_one():
    model = GPT(CONFIG)
    model.load_state_dict(state())
    passes = []
    model.blocks[0].register_forward_hook(lambda *_: passes.append(1))
    x, y = validation_batch(random_tokens(), CONFIG.context, 4)  # the clouds' batch is this one: shared
    layers = linear_layer_names(CONFIG.layers)
    shared = model_on_batch(model, x, y, gradients=(x, y), clouds=clouds_of(PARAMS))
    shared_rows = gradient_rows(shared.gradients, layers, PARAMS)
    assert len(passes) == 1
    apart = model_on_batch(model, x, y, gradients=(x, y), clouds=None)  # as when the batches differ
    apart_rows = gradient_rows(apart.gradients, layers, PARAMS)
    assert len(passes) == 3
    assert_shared_pass_equals_separate(shared, apart, shared_rows, apart_rows)
    assert all(p.grad is None for p in model.parameters())
    x2, y2 = validation_batch(random_tokens()[8:], CONFIG.context, 4)
    other = model_on_batch(model, x, y, gradients=(x2, y2), clouds=clouds_of(PARAMS))  # another batch: apart
    assert other.gradients.found is None and len(passes) == 4
    off = clouds_of(dataclasses.replace(PARAMS, families=("np",)))
    assert off is None and model_on_batch(model, x, y, gradients=(x, y), clouds=off).gradients.found is None


@pytest.mark.parametrize("during_pass", [False, True])
def test_a_shared_pass_that_fails_still_gives_the_forward_features_and_the_reason(monkeypatch, during_pass):
    import topometrics.features.gradient_cloud as G

    @contextlib.contextmanager
    def failing_hooks(scale):
        yield
        raise RuntimeError("no batched rule for this layer\nmore")

    def no_rule(*args, run_pass, **kwargs):
        if during_pass:  # the hooks fail as the forward features' pass ends: it runs again, plainly
            run_pass(failing_hooks)
        raise RuntimeError("no batched rule for this layer\nmore")

    model = GPT(CONFIG)
    model.load_state_dict(state())
    x, y = validation_batch(random_tokens(), CONFIG.context, 4)
    expected = model_on_batch(model, x, y, gradients=(x, y), clouds=None)
    monkeypatch.setattr(G, "gradient_topology", no_rule)
    passes = []
    model.blocks[0].register_forward_hook(lambda *_: passes.append(1))
    got = model_on_batch(model, x, y, gradients=(x, y), clouds=clouds_of(PARAMS))
    assert len(passes) == (2 if during_pass else 1)
    assert got.gradients == "per-example gradients not computable on this model: no batched rule for this layer"
    assert got.loss == expected.loss and got.grad_norms == expected.grad_norms
    assert all(p.grad is None for p in model.parameters())
