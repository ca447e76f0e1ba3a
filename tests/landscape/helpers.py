"""Helpers shared by the landscape tests: a model's parameters and a tiny GPT's loss as a function of them."""

import torch
from torch import nn

from topometrics.landscape.slice import functional_loss
from topometrics.models.model import GPT, GPTConfig


def params_of(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def gpt_loss():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=16, context=8, hidden=8, layers=1, heads=2)).double()
    x = torch.randint(0, 16, (3, 8))
    y = torch.roll(x, -1, dims=1)
    loss = functional_loss(model, lambda call: nn.functional.cross_entropy(call(x).reshape(-1, 16), y.reshape(-1)))
    return model, x, y, loss
