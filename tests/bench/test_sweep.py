"""bench sweep's projects: the tiny layout and the 96-run character sweep's, as params.yaml declares them."""

import json
from pathlib import Path

import pytest

from bench.sweep import layout_params, make_project
from topometrics.params import load_params


def test_the_sweep96_layout_declares_the_character_sweeps_96_runs(tmp_path: Path):
    text = tmp_path / "text.txt"
    text.write_text("some text\n")
    runs = make_project(tmp_path / "project", layout_params("sweep96", 4, 200, 10, text))
    params = load_params(tmp_path / "project" / "params.yaml")
    assert runs == len(params.runs()) == 96
    assert sorted(params.ladder) == ["medium", "small", "tiny"] and list(params.variants) == ["lr_hi", "lr_lo", "wsd"]
    assert (params.train.steps, params.train.ckpt_every, params.train.warmup) == (1000, 50, 100)
    assert len(params.train.seeds) == 8 and params.features.landscape_every == 2
    assert params.features.hessian_exact_max == 0 and params.analysis.primary.features == ("ls_rand_range",)
    assert params.data.corpus == str(text.resolve()) and params.series.sources == {}
    assert (tmp_path / "project" / ".git").is_dir() and (tmp_path / "project" / "dvc.yaml").is_file()


def test_the_tiny_layout_takes_its_seeds_steps_and_checkpoints_from_the_command_line(tmp_path: Path):
    runs = make_project(tmp_path / "project", layout_params("tiny", 3, 30, 10, None))
    params = load_params(tmp_path / "project" / "params.yaml")
    assert runs == len(params.runs()) == 6 and list(params.variants) == []
    assert (params.train.steps, params.train.ckpt_every, params.train.seeds) == (30, 10, (0, 1, 2))


def test_the_bpe96_layout_declares_the_bpe_confirmation_sweeps_runs_and_its_own_question(tmp_path: Path):
    text = tmp_path / "text.txt"
    text.write_text("some text\n")
    runs = make_project(tmp_path / "project", layout_params("bpe96", 4, 200, 10, text))
    params = load_params(tmp_path / "project" / "params.yaml")
    assert runs == len(params.runs()) == 96 and sorted(params.ladder) == ["medium", "small", "tiny"]
    assert params.train.seeds == (2, 12, 22, 32, 42, 52, 62, 72) and params.train.steps == 1000
    assert params.data.tokenizer.kind == "bpe" and params.data.tokenizer.vocab_size == 512
    assert params.analysis.loss_unit == "bpb" and params.features.landscape_radius == 1.0
    primary = params.analysis.primary
    assert (primary.features, primary.fraction, primary.cv, primary.level) == (
        ("ls_rand_range",),
        0.2,
        "seed",
        "between",
    )
    assert primary.baseline == "norm+curvature" and params.features.hessian_exact_max == 0
    assert params.data.corpus == str(text.resolve())


def test_the_shared_checkpoints_are_read_from_the_features_stages_summary_line():
    from bench.sweep import shared_checkpoints

    head = "features: 96 runs, 2016 checkpoints, 0 failed, 0 runs without checkpoints, 505.9 s (5.27 s per run)"
    log = f"Running stage 'features':\n{head}; 120 the same as another run's (equal weights), computed once\n"
    assert shared_checkpoints(log) == 120
    assert shared_checkpoints(log + f"{head}\n") == 0  # the last stage's line counts
    assert shared_checkpoints("features@a: 4 checkpoints, 4 computed\n") == 0  # one run: no summary line


@pytest.mark.slow
def test_a_tiny_sweep_times_its_features_stage_and_the_rest_apart(tmp_path: Path, capsys):
    from bench.sweep import main

    assert main(["--seeds", "3", "--steps", "20", "--ckpt-every", "10", "--keep", str(tmp_path)]) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert result["runs"] == 6 and result["shared_checkpoints"] == 0  # two rungs, no recipes: nothing shared
    assert result["post_training_s"] == pytest.approx(result["features_stage_s"] + result["after_features_s"], abs=0.02)
    assert result["post_over_train"] == pytest.approx(result["post_training_s"] / result["train_s"], abs=2e-3)
    assert (tmp_path / "project" / "data" / "warehouse.duckdb").is_file()  # the rest ran after the features
