"""topometrics.features.forward: the fixed batches and one forward/backward pass of our GPT on them."""

import numpy as np
import pytest
import torch

from tests.features.helpers import CONFIG, PARAMS, tiny_model
from topometrics.features.forward import (
    LossSurface,
    model_on_batch,
    on_device,
    surface_batch,
    validation_batch,
)
from topometrics.models.model import linear_modules

TOKENS = np.random.default_rng(0).integers(0, 128, 400).astype(np.uint8)


def test_validation_batch_windows_and_shifted_targets():
    tokens = np.arange(100, dtype=np.uint8)
    x, y = validation_batch(tokens, 8, 3)
    assert x.shape == y.shape == (3, 8)
    assert x[1].tolist() == list(range(8, 16)) and y[1].tolist() == list(range(9, 17))
    with pytest.raises(ValueError, match="lower features.rep_batch"):
        validation_batch(tokens, 50, 2)


def test_the_surface_batch_is_the_first_windows_at_every_surface_checkpoint_and_a_reason_between():
    for index in (0, PARAMS.landscape_every, 3 * PARAMS.landscape_every):
        x, y = surface_batch(TOKENS, CONFIG.context, PARAMS, index)
        first_x, first_y = validation_batch(TOKENS, CONFIG.context, PARAMS.landscape_batch)
        assert torch.equal(x, first_x) and torch.equal(y, first_y)
    between = f"not a loss-surface checkpoint (features.landscape_every = {PARAMS.landscape_every})"
    assert surface_batch(TOKENS, CONFIG.context, PARAMS, 1) == between


def test_one_pass_gives_the_models_loss_its_gradient_norms_and_its_last_states():
    model = tiny_model(5)
    x, y = validation_batch(TOKENS, CONFIG.context, PARAMS.rep_batch)
    surface = surface_batch(TOKENS, CONFIG.context, PARAMS, 0)
    got = model_on_batch(model, x, y, surface)
    # computed here with plain torch, apart from the pass
    model.zero_grad(set_to_none=True)
    loss = model.loss(x, y)
    loss.backward()
    norms = {name: float(m.weight.grad.norm()) for name, m in linear_modules(model).items()}
    with torch.no_grad():
        states = model.hidden_states(x).reshape(-1, CONFIG.hidden).double().numpy()
        sx, sy = surface
        logits = model(sx)
        surface_loss = float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), sy.reshape(-1)))
    assert got.loss == pytest.approx(float(loss), rel=1e-6) and got.grad_norms == pytest.approx(norms, rel=1e-6)
    assert got.states.shape == (PARAMS.rep_batch * CONFIG.context, CONFIG.hidden)
    np.testing.assert_allclose(got.states, states, rtol=1e-6)
    assert isinstance(got.surface, LossSurface)
    assert float(got.surface.loss(got.surface.params)) == pytest.approx(surface_loss, rel=1e-6)
    assert np.isnan(got.bpb) and got.gradients == "no gradient batch"  # no byte count, no gradient batch given
    assert model_on_batch(model, x, y).surface == "no batch"


def test_on_device_moves_every_tensor_and_passes_a_reason_through():
    assert on_device("no batch: the reason", torch.device("cpu")) == "no batch: the reason"
    moved = on_device(validation_batch(TOKENS, CONFIG.context, 2), torch.device("meta"))
    assert [t.device.type for t in moved] == ["meta", "meta"]
