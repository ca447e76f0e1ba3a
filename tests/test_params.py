"""params.yaml validation: unknown keys, wrong types and impossible values name the key."""

import dataclasses
from pathlib import Path

import pytest
import yaml

from topometrics.params import ParamsError, load_params, parse_params, run_name
from topometrics.train import build_rung_config

REPO = Path(__file__).resolve().parents[1]


def default_raw() -> dict:
    return yaml.safe_load((REPO / "params.yaml").read_text())


def test_the_repository_params_load_and_give_the_papers_ladder():
    params = load_params(REPO / "params.yaml")
    shapes = {rung: params.rung_shape(rung) for rung in params.ladder}
    assert shapes == {
        "tiny": {"hidden": 8, "layers": 1, "heads": 1},
        "small": {"hidden": 16, "layers": 1, "heads": 2},
        "medium": {"hidden": 24, "layers": 2, "heads": 2},
        "large": {"hidden": 32, "layers": 3, "heads": 4},
        "xl": {"hidden": 48, "layers": 3, "heads": 4},
    }
    t = params.train
    assert (t.steps, t.ckpt_every, t.batch_size, t.lr, t.warmup, t.weight_decay, t.grad_clip, t.seeds) == (
        5000,
        100,
        64,
        3e-3,
        200,
        0.01,
        1.0,
        (42,),
    )


def test_empty_rung_inherits_and_partial_rung_overrides():
    raw = default_raw()
    raw["train"]["hidden"] = 64
    raw["ladder"]["tiny"] = {"layers": 2}
    params = parse_params(raw)
    assert params.rung_shape("xl") == {"hidden": 64, "layers": 3, "heads": 4}
    assert params.rung_shape("tiny") == {"hidden": 64, "layers": 2, "heads": 4}


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("train", "hidden_size", 8, "unknown param train.hidden_size"),
        ("train", "steps", "many", "train.steps must be int"),
        ("train", "lr", True, "train.lr must be float"),
        ("train", "steps", 550, "train.steps=550 is not a multiple of train.ckpt_every=100"),
        ("train", "batch_size", 0, "train.batch_size must be positive"),
        ("train", "heads", 5, "ladder.xl: hidden=48 is not divisible by heads=5"),
        ("train", "device", "tpu", "train.device must be auto, cpu or cuda"),
        ("data", "seq_len", -1, "data.seq_len must be positive"),
        ("data", "urls", "http://x", "data.urls must be a list of str"),
        ("analysis", "fractions", [0.2, 1.5], "analysis.fractions must be shares in"),
        ("features", "max_points", 0, "features.max_points must be positive"),
        ("train", "seeds", [], "train.seeds must be a non-empty list of distinct integers"),
        ("train", "seeds", [1, 1], "train.seeds must be a non-empty list of distinct integers"),
        ("train", "seeds", [-1], "train.seeds must be a non-empty list of distinct integers"),
        ("train", "seeds", 42, "train.seeds must be a list of int"),
        ("train", "seed", 42, "unknown param train.seed: train.seed became train.seeds"),
    ],
)
def test_invalid_params_name_the_key(section, key, value, message):
    raw = default_raw()
    raw[section][key] = value
    with pytest.raises(ParamsError, match=message.replace(".", r"\.").replace("(", r"\(")):
        parse_params(raw)


def test_invalid_rung_override_names_the_rung():
    raw = default_raw()
    raw["ladder"]["small"] = {"hidden": 16, "heads": 3}
    with pytest.raises(ParamsError, match=r"ladder\.small: hidden=16 is not divisible by heads=3"):
        parse_params(raw)
    raw["ladder"]["small"] = {"width": 16}
    with pytest.raises(ParamsError, match=r"unknown param ladder\.small\.width"):
        parse_params(raw)


def test_unknown_section_is_rejected():
    raw = default_raw() | {"trian": {}}
    with pytest.raises(ParamsError, match="unknown param trian"):
        parse_params(raw)


def test_run_configs_are_one_per_rung_and_seed():
    raw = default_raw()
    raw["train"]["seeds"] = [42, 7]
    params = parse_params(raw)
    a, b = (build_rung_config(params, "tiny", seed) for seed in (42, 7))
    assert (a.recipe.seed, b.recipe.seed) == (42, 7)
    assert a.model == b.model and a.recipe == dataclasses.replace(b.recipe, seed=42)
    assert run_name("tiny", 7) == "tiny-7"
    with pytest.raises(ParamsError, match=r"seed 3 is not in train\.seeds=\[42, 7\]"):
        build_rung_config(params, "tiny", 3)
