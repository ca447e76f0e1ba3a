"""Helpers shared by the training tests (and the scripts they run in subprocesses): the offline text split into
train and validation, a tiny run's config, and a silent progress callback."""

import dataclasses

from topometrics.models.model import GPTConfig
from topometrics.models.tokens import encode
from topometrics.training.corpus import offline_text
from topometrics.training.train import Recipe, RunConfig

TEXT = encode(offline_text()[:200_000])


TRAIN, VAL = TEXT[:180_000], TEXT[180_000:]


def config(steps=40, ckpt_every=10, lr=3e-3, seed=7) -> RunConfig:
    recipe = Recipe(steps, ckpt_every, 8, lr, 5, 0.0, 0.01, 1.0, seed, 8)
    return RunConfig("t", GPTConfig(hidden=8, layers=1, heads=1, context=32), recipe)


def quiet(*_):
    pass


def config_with_batch(batch_size: int, steps=20, lr=3e-3) -> RunConfig:
    recipe = dataclasses.replace(config(steps=steps, lr=lr).recipe, batch_size=batch_size)
    return dataclasses.replace(config(), recipe=recipe)
