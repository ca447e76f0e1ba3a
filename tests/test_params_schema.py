"""topometrics.params_schema: the rules params are checked by (unknown keys, finite numbers, run names, endpoints)."""

import pytest

from tests.helpers import RECIPES, REPO, default_raw
from topometrics.params import ParamsError, load_params, parse_params


def test_unknown_section_is_rejected():
    raw = default_raw() | {"trian": {}}
    with pytest.raises(ParamsError, match="unknown param trian"):
        parse_params(raw)


def test_runs_that_would_share_a_name_are_refused():
    raw = default_raw() | {"variants": {"b": {"lr": 0.001}}}
    raw["ladder"] = {"a": {}, "a-b": {}}
    with pytest.raises(ParamsError, match=r"runs \['a-b-42'\] are declared twice"):
        parse_params(raw)


def test_yaml_nan_and_inf_are_refused_naming_the_key(tmp_path):
    text = (REPO / "params.yaml").read_text().replace("  lr: 0.003\n", "  lr: .nan\n")
    assert "lr: .nan" in text
    (tmp_path / "params.yaml").write_text(text)
    with pytest.raises(ParamsError, match=r"^train\.lr must be a finite number, got nan; write a number such as"):
        load_params(tmp_path / "params.yaml")


@pytest.mark.parametrize(
    ("recipes", "seeds", "level", "message"),
    [
        ({}, [1, 2, 3], "between", r"1 recipes per rung give a smallest p above alpha=0.05; declare >= 3 recipes"),
        (RECIPES, [1], "within", r"1 seed per cell; declare >= 2 seeds"),
        (RECIPES, [1, 2], "sideways", r"level 'sideways' is not 'between' or 'within'"),
    ],
)
def test_a_primary_endpoint_at_a_level_the_runs_cannot_carry_is_one_params_line(recipes, seeds, level, message):
    raw = default_raw() | {"variants": recipes}
    raw["train"]["seeds"] = seeds
    raw["analysis"]["primary"] = {"family": "weights_vr", "fraction": 0.3, "cv": "rung", "level": level}
    with pytest.raises(ParamsError, match=message):
        parse_params(raw)
