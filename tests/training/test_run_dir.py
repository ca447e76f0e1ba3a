"""topometrics.training.run_dir: what a run directory says about resuming (the resume state's step, the step log)."""

import torch

from tests.training.helpers import TRAIN, VAL, config, quiet
from topometrics.models.checkpoints import (
    list_checkpoints,
)
from topometrics.training.run_dir import resume_info, truncate_steps_log
from topometrics.training.train import (
    train_run,
)


def test_a_kill_between_resume_weights_and_their_step_cannot_pair_them_wrongly(tmp_path):
    """Regression: the resume weights and their step were two files (resume.safetensors, then
    resume.json); a kill between the two renames resumed step-40 state as step 20, so the killed
    run under `pytest -n 2` sometimes ended with other weights. Now the step is the file's metadata."""
    torch.set_num_threads(1)
    train_run(config(steps=20), TRAIN, VAL, tmp_path, "sha", "cpu", quiet)
    info = resume_info(tmp_path)
    fingerprint = info["recipe_fingerprint"]
    assert info == {"step": 20, "rung": "t", "variant": "base", "seed": 7, "recipe_fingerprint": fingerprint}
    assert info["recipe_fingerprint"] == list_checkpoints(tmp_path)[-1].meta["recipe_fingerprint"]
    assert not (tmp_path / "resume.json").exists()


def test_a_half_written_row_of_the_step_log_is_dropped_on_resume(tmp_path):
    """Regression: a kill mid-write left `6` of `61,...` as the log's last line, kept as step 6."""
    torch.set_num_threads(1)
    train_run(config(steps=20), TRAIN, VAL, tmp_path, "sha", "cpu", quiet)
    whole = (tmp_path / "steps.csv").read_text()
    with (tmp_path / "steps.csv").open("a") as f:
        f.write("2")
    truncate_steps_log(tmp_path / "steps.csv", 20)
    assert (tmp_path / "steps.csv").read_text() == whole
