"""topometrics.verdict.remedy: what a sweep too small for a verdict needs (runs, recipes, spacing, time)."""

import pytest

from tests.repo_params import raw_params
from tests.verdict.helpers import SWEEP_LAYOUT
from topometrics.verdict import remedy


def test_remedy_is_empty_when_the_design_allows_a_verdict():
    default = {"train": {"steps": 5000, "ckpt_every": 100, "seeds": [42]}, "analysis": {"fractions": [0.2, 0.3, 0.5]}}
    default |= {"ladder": dict.fromkeys(["tiny", "small", "medium", "large", "xl"], {}), "variants": {}}
    assert remedy.remedy(default) == []  # leave-one-rung-out over five rungs, 11 checkpoints by 20%
    assert remedy.remedy(default | {"analysis": {"fractions": [0.05]}}) == [
        ("train.ckpt_every=50", "4 checkpoints by 5% of training")
    ]


def test_the_loss_surface_spacing_is_checked_against_the_first_fraction():
    sweep = {"train": {"steps": 1000, "ckpt_every": 50, "seeds": [1, 2, 3]}, "analysis": {"fractions": [0.2, 0.3]}}
    sweep |= {"ladder": dict.fromkeys(["tiny", "small", "medium"], {}), "variants": {}}
    every = list(raw_params()["features"]["families"])  # params.yaml's: the loss-surface families included
    why = "3 loss-surface checkpoints (landscape, curvature) by 20% of training"
    # every 10th of 21 checkpoints: steps 0 and 500, one by step 200; every 2nd: 0, 100, 200
    spaced = sweep | {"features": {"landscape_every": 10, "families": every}}
    assert remedy.surface_remedy(spaced) == [("features.landscape_every=2", why)]
    assert remedy.surface_remedy(sweep | {"features": {"landscape_every": 2, "families": every}}) == []
    assert remedy.surface_remedy(sweep | {"features": {"landscape_every": 10, "families": ["np", "vr"]}}) == []
    assert remedy.remedy(spaced) == [("features.landscape_every=2", why)]


def test_the_layout_an_answer_needs_is_the_measured_sweeps_cells_with_the_declared_rungs():
    assert remedy.answer_layout(SWEEP_LAYOUT) is None  # the measured layout itself: nothing more to ask
    single = SWEEP_LAYOUT | {"variants": {}, "train": SWEEP_LAYOUT["train"] | {"seeds": [42]}}
    need = remedy.answer_layout(single)
    assert (need.recipes, need.seeds, need.cells, need.runs) == (16, 2, 48, 96)
    five = single | {"ladder": dict.fromkeys(["tiny", "small", "medium", "large", "xl"], {})}
    assert (remedy.answer_layout(five).recipes, remedy.answer_layout(five).runs) == (10, 100)  # ceil(48 / 5) = 10
    one = single | {"ladder": {"tiny": {}}}
    assert remedy.answer_layout(one).cells == 48  # 48 recipes on one rung
    assert remedy.layout_command(single, need) == (
        "dvc exp run $(python tools/sample_recipes.py --n 15 --seed 2026 --steps 1000) -S 'train.seeds=[42,43]' "
        "-S features.landscape_every=2"  # the default every 5th checkpoint has one loss surface by 20 %: needs 3
    )


def test_training_minutes_is_the_longest_first_schedule_of_every_runs_tokens_at_its_rungs_rate():
    params = {"train": {"steps": 10, "batch_size": 10}, "data": {"seq_len": 10}}  # 1,000 tokens per run
    layout = remedy.Layout(("a", "b"), recipes=2, seeds=1)  # runs of 1 s (a) and 2 s (b), two of each
    rates = {"a": 1000.0, "b": 500.0}
    assert remedy.training_minutes(params, layout, rates, workers=1) == pytest.approx(6 / 60)
    assert remedy.training_minutes(params, layout, rates, workers=2) == pytest.approx(3 / 60)  # b|b, then a|a
    assert remedy.training_minutes(params, layout, rates, workers=3) == pytest.approx(2 / 60)  # b, b, a then a
    assert remedy.training_minutes(params, layout, {"a": 1000.0}, workers=2) is None  # b never trained here
