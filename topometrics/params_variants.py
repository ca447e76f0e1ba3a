"""params.yaml's ``variants``: named recipe variants beside ``train``'s own (the base), each a set of
overrides of the recipe keys; the model's shape is ``ladder``'s and the run-level keys are ``train``'s alone.
Composed into ``Params`` by :mod:`topometrics.params` (``Params.recipe`` applies a variant's overrides).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from topometrics import params_schema as schema
from topometrics.params_schema import ParamsError, build

SHAPE_KEYS = ("hidden", "layers", "heads")
# keys of `train` that a recipe variant may override (the shape belongs to `ladder`)
RECIPE_KEYS = ("steps", "ckpt_every", "batch_size", "lr", "warmup", "min_lr_ratio", "weight_decay", "grad_clip")
RECIPE_KEYS += ("schedule", "decay_fraction")  # the LR schedule's shape (topometrics/models/lr_schedule.py)
BASE_VARIANT = "base"  # the recipe in `train` itself; its runs keep the short name <rung>-<seed>


@dataclass(frozen=True)
class Variant:
    """A named recipe variant: ``train``'s recipe with these keys overridden (None = inherited)."""

    steps: int | None = None
    ckpt_every: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    warmup: int | None = None
    min_lr_ratio: float | None = None
    weight_decay: float | None = None
    grad_clip: float | None = None
    schedule: str | None = None
    decay_fraction: float | None = None

    def overrides(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def parse_variants(raw: object, train_keys: set[str]) -> dict[str, Variant]:
    """``variants``: name -> overrides of train's recipe keys; the shape and the other keys of ``train``
    (``train_keys``: run-level, such as seeds) are refused."""
    if not isinstance(raw, dict):
        raise ParamsError(
            f"variants must map variant names to recipe overrides, e.g. lr_hi: {{lr: 0.006}}; got {raw!r}"
        )
    variants = {}
    for name, overrides in raw.items():
        schema.check_name("variants", name, "_", "lr_hi")
        if name == BASE_VARIANT:
            raise ParamsError(
                f"variants.{BASE_VARIANT}: '{BASE_VARIANT}' is the recipe in train itself; "
                "change train.<key> or give this variant another name"
            )
        overrides = overrides or {}
        if not isinstance(overrides, dict):
            raise ParamsError(f"variants.{name} must map recipe keys to values, e.g. {{lr: 0.006}}; got {overrides!r}")
        for key in overrides:
            if key in SHAPE_KEYS:
                raise ParamsError(
                    f"variants.{name}.{key}: the model shape belongs in ladder, not in a recipe variant; "
                    f"add a rung, e.g. ladder.{name}: {{{key}: ...}}"
                )
            if key not in RECIPE_KEYS and key in train_keys:
                raise ParamsError(
                    f"variants.{name}.{key}: train.{key} applies to every run, not a recipe variant; "
                    f"variants may set {', '.join(RECIPE_KEYS)}"
                )
            if key not in RECIPE_KEYS:
                raise ParamsError(f"unknown param variants.{name}.{key}; variants may set {', '.join(RECIPE_KEYS)}")
        variants[name] = build(Variant, overrides, f"variants.{name}")
    return variants
