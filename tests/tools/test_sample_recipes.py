"""tools/sample_recipes.py: reproducible recipes inside their declared ranges, accepted by the params parser."""

import math
import subprocess
import sys

import yaml

from tools.sample_recipes import (
    BATCH_SIZES,
    DECAY_RANGE,
    LR_RANGE,
    SHAPES,
    WARMUP_SHARE,
    WD_RANGE,
    overrides,
    sample_recipes,
)
from topometrics.params import parse_params


def test_the_same_seed_gives_the_same_recipes_and_another_seed_others():
    assert sample_recipes(8, 7, 1000) == sample_recipes(8, 7, 1000)
    assert sample_recipes(8, 7, 1000) != sample_recipes(8, 8, 1000)


def test_every_draw_lies_in_its_range_and_the_rates_span_most_of_it():
    recipes = sample_recipes(200, 0, 1000).values()
    assert all(LR_RANGE[0] <= r["lr"] <= LR_RANGE[1] for r in recipes)
    assert all(WD_RANGE[0] <= r["weight_decay"] <= WD_RANGE[1] for r in recipes)
    assert all(WARMUP_SHARE[0] * 1000 - 1 <= r["warmup"] <= WARMUP_SHARE[1] * 1000 + 1 for r in recipes)
    assert {r["schedule"] for r in recipes} == set(SHAPES)
    assert {r["batch_size"] for r in recipes} == set(BATCH_SIZES)
    assert all(("decay_fraction" in r) == (r["schedule"] != "cosine") for r in recipes)
    assert all(DECAY_RANGE[0] <= r["decay_fraction"] <= DECAY_RANGE[1] for r in recipes if "decay_fraction" in r)
    log_lr = sorted(math.log(r["lr"]) for r in recipes)  # log-uniform: the quartiles split the log range evenly
    span = math.log(LR_RANGE[1]) - math.log(LR_RANGE[0])
    assert abs(log_lr[50] - (math.log(LR_RANGE[0]) + span / 4)) < 0.15 * span


def test_the_recipes_are_variants_the_params_parser_accepts():
    with open("params.yaml") as f:
        raw = yaml.safe_load(f)
    raw["variants"] = sample_recipes(15, 2026, raw["train"]["steps"])
    params = parse_params(raw)
    assert list(params.variants) == [f"r{i:02d}" for i in range(1, 16)]
    assert params.recipe("r03").lr == raw["variants"]["r03"]["lr"]


def test_each_override_is_one_shell_word_and_the_yaml_block_parses_to_the_same_recipes():
    recipes = sample_recipes(5, 3, 1000)
    assert all(" " not in o and not set("*?[") & set(o) for o in overrides(recipes))
    out = subprocess.run([sys.executable, "tools/sample_recipes.py", "--n", "5", "--seed", "3", "--yaml"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert yaml.safe_load(out)["variants"] == recipes
