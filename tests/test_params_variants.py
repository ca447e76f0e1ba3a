"""topometrics.params_variants: a recipe variant overrides train's recipe keys and nothing else, named in one line."""

import pytest

from tests.helpers import default_raw
from topometrics.params import ParamsError, parse_params


@pytest.mark.parametrize(
    ("variants", "message"),
    [
        ({"wide": {"hidden": 64}}, "variants.wide.hidden: the model shape belongs in ladder"),
        ({"v": {"seeds": [1]}}, "variants.v.seeds: train.seeds applies to every run"),
        ({"v": {"device": "cpu"}}, "variants.v.device: train.device applies to every run"),
        ({"v": {"monitor_every": 10}}, "variants.v.monitor_every: train.monitor_every applies to every run"),
        ({"v": {"sketch_every": 5}}, "variants.v.sketch_every: train.sketch_every applies to every run"),
        ({"v": {"learning_rate": 1}}, "unknown param variants.v.learning_rate; variants may set steps"),
        ({"": {"lr": 1}}, "variants: the name '' must be 1 to 64 ASCII letters, digits or '_'"),
        ({"lr-hi": {"lr": 1}}, "variants: the name 'lr-hi' must be 1 to 64"),
        ({"base": {"lr": 1}}, "variants.base: 'base' is the recipe in train itself"),
        ({"v": {"lr": "fast"}}, "variants.v.lr must be float"),
        ({"v": {"steps": 550}}, "variants.v: steps=550 is not a multiple of ckpt_every=100"),
        ({"v": {"warmup": 9000}}, "variants.v: warmup=9000 must be smaller than steps=5000"),
        ({"v": {"lr": 0}}, "variants.v.lr must be positive"),
        ({"v": {"lr": float("nan")}}, "variants.v.lr must be a finite number, got nan"),
        ({"v": [1]}, "variants.v must map recipe keys to values"),
        ([1], "variants must map variant names to recipe overrides"),
    ],
)
def test_invalid_variants_name_the_key_and_the_fix(variants, message):
    with pytest.raises(ParamsError, match=message.replace(".", r"\.").replace("(", r"\(")):
        parse_params(default_raw() | {"variants": variants})
