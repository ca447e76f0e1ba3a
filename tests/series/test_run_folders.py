"""Run folders: Trainer output and plain safetensors files, built here from tiny random models."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

from tests.series.helpers import sparse_safetensors
from topometrics.series.run_folders import RunFolderError, read_losses, scan_run_folder, step_from_name, trainer_losses


def tiny_llama(hidden: int = 16) -> LlamaForCausalLM:
    cfg = LlamaConfig(hidden_size=hidden, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                      vocab_size=64)  # fmt: skip
    return LlamaForCausalLM(cfg)


def trainer_state(step: int, history: list[dict]) -> str:
    return json.dumps({"global_step": step, "log_history": history})


@pytest.fixture(scope="module")
def trainer_run(tmp_path_factory):
    """checkpoint-<step>/ folders as the Trainer writes them (its pickles included, as junk bytes)."""
    root = tmp_path_factory.mktemp("trainer")
    model = tiny_llama()
    history = []
    for step in (10, 20, 30):
        history += [{"loss": 5.0 - step / 10, "step": step}, {"eval_loss": 6.0 - step / 10, "step": step}]
        folder = root / f"checkpoint-{step}"
        model.save_pretrained(folder, max_shard_size="2KB" if step == 30 else "1GB")
        (folder / "trainer_state.json").write_text(trainer_state(step, history))
        (folder / "optimizer.pt").write_bytes(b"not a pickle: never opened")
    (root / "checkpoint-20" / "trainer_state.json").write_text("{not json")  # malformed
    (root / "checkpoint-30" / "trainer_state.json").unlink()  # missing, and no run-level file
    return root


def test_trainer_checkpoints_with_steps_losses_and_shards(trainer_run):
    run = scan_run_folder(trainer_run)
    assert [c.step for c in run.checkpoints] == [10, 20, 30] and run.skipped == []
    assert len(run.checkpoints[2].weights) > 1  # sharded
    assert all(c.config_dir == trainer_run / c.revision for c in run.checkpoints)
    losses = run.losses()
    assert losses.loc[0, ["val_loss", "train_loss"]].tolist() == [5.0, 4.0]
    assert pd.isna(losses.loc[0, "reason"])
    assert losses.loc[1:, ["val_loss", "train_loss"]].isna().all().all()
    assert losses.loc[1, "reason"].endswith("checkpoint-20/trainer_state.json: malformed trainer_state.json "
                                            "(JSONDecodeError: Expecting property name enclosed in double quotes: "
                                            "line 1 column 2 (char 1))")  # fmt: skip
    assert losses.loc[2, "reason"] == "no trainer_state.json in checkpoint-30 or the run folder"


def test_trainer_losses_only_at_the_checkpoint_step(tmp_path):
    state = tmp_path / "trainer_state.json"
    state.write_text(trainer_state(20, [{"loss": 3.0, "step": 15}, {"loss": 2.5, "step": 20}]))
    reason = "trainer_state.json logs no eval_loss at step 20 (make logging_steps and eval_steps divide save_steps)"
    assert trainer_losses(state, 20) == (None, 2.5, reason)
    state.write_text(trainer_state(20, [{"loss": 3.0, "step": 15}, {"eval_loss": 1.5, "step": 20}]))
    assert trainer_losses(state, 20)[:2] == (1.5, None)
    # the run folder's file, written at the end of training, stands in for a checkpoint's own
    assert trainer_losses(tmp_path / "checkpoint-20" / "trainer_state.json", 20, state)[0] == 1.5


@pytest.mark.parametrize(
    ("name", "step"),
    [("checkpoint-500", 500), ("step_000100", 100), ("step100", 100), ("run-a-300", 300), ("model_7", 7),
     ("step0", 0), ("final", None), ("model", None)],
)  # fmt: skip
def test_step_from_name(name, step):
    assert step_from_name(name) == step


def plain_run(root, steps=(0, 100, 200), suffix=".csv"):
    model = tiny_llama()
    model.config.save_pretrained(root)
    gen = torch.Generator().manual_seed(0)
    for step in steps:
        state = {k: torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items() if k != "lm_head.weight"}
        save_file(state, str(root / f"run-{step}.safetensors"))
    return root


def test_plain_files_with_a_losses_csv(tmp_path):
    plain_run(tmp_path)
    (tmp_path / "losses.csv").write_text("step,loss,eval_loss\n0,4.1,4.2\n100,3.0,3.3\n150,2.9,\n")
    run = scan_run_folder(tmp_path, tmp_path / "losses.csv")
    assert [c.revision for c in run.checkpoints] == ["run-0.safetensors", "run-100.safetensors", "run-200.safetensors"]
    assert all(c.config_dir == tmp_path for c in run.checkpoints)
    losses = run.losses()
    assert losses["val_loss"].tolist()[:2] == [4.2, 3.3] and losses["train_loss"].tolist()[:2] == [4.1, 3.0]
    assert losses.loc[2, "reason"] == "the losses file has no row for step 200"


def test_jsonl_losses_with_train_and_eval_on_separate_lines(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"step": 5, "loss": 2.0}\n{"step": 5, "eval_loss": 2.5}\n{"step": 6, "loss": 1.0}\n')
    table = read_losses(path)
    assert table["step"].tolist() == [5, 6]
    assert table["val_loss"].iloc[0] == 2.5 and np.isnan(table["val_loss"].iloc[1])
    assert table["train_loss"].tolist() == [2.0, 1.0]


def test_losses_file_without_loss_columns_is_named(tmp_path):
    path = tmp_path / "log.csv"
    path.write_text("step,accuracy\n1,0.5\n")
    with pytest.raises(RunFolderError, match=r"log.csv: needs a step column and val_loss"):
        read_losses(path)


def test_pickle_weights_are_skipped_with_the_conversion_and_never_opened(tmp_path):
    plain_run(tmp_path, steps=(0,))
    (tmp_path / "step_300.pt").write_bytes(b"\x80 not a pickle either")
    (tmp_path / "checkpoint-400").mkdir()
    (tmp_path / "checkpoint-400" / "pytorch_model.bin").write_bytes(b"junk")
    run = scan_run_folder(tmp_path)
    skipped = {s["revision"]: s for s in run.skipped}
    assert skipped["step_300.pt"]["step"] == 300 and skipped["checkpoint-400"]["step"] == 400
    reason = skipped["step_300.pt"]["reason"]
    assert "pickle weights are never opened" in reason
    assert f"torch.load('{tmp_path / 'step_300.pt'}', map_location='cpu', weights_only=True)" in reason
    assert reason.endswith(f"sd.items()}}, '{tmp_path / 'step_300.safetensors'}')\"")
    assert skipped["checkpoint-400"]["reason"].endswith(f"'{tmp_path / 'checkpoint-400' / 'model.safetensors'}')\"")
    assert [c.step for c in run.checkpoints] == [0]


def test_a_checkpoint_of_another_architecture_is_skipped(tmp_path):
    plain_run(tmp_path)
    other = tiny_llama(hidden=8).state_dict()
    save_file({k: v for k, v in other.items() if k != "lm_head.weight"}, str(tmp_path / "run-300.safetensors"))
    run = scan_run_folder(tmp_path)
    assert [c.step for c in run.checkpoints] == [0, 100, 200]
    (skip,) = run.skipped
    assert skip["revision"] == "run-300.safetensors"
    assert skip["reason"].startswith(
        "different architecture from the folder's other 3 checkpoints (model.embed_tokens.weight (64, 8))"
    )


def test_empty_folder_truncated_file_and_repeated_step(tmp_path):
    assert scan_run_folder(tmp_path).skipped[0]["reason"].startswith(f"{tmp_path}: no checkpoints")
    plain_run(tmp_path, steps=(1, 2))
    (tmp_path / "step_2.safetensors").write_bytes((tmp_path / "run-2.safetensors").read_bytes())
    (tmp_path / "run-9.safetensors").write_bytes((tmp_path / "run-1.safetensors").read_bytes()[:100])
    run = scan_run_folder(tmp_path)
    assert [c.revision for c in run.checkpoints] == ["run-1.safetensors", "run-2.safetensors"]
    reasons = {s["revision"]: s["reason"] for s in run.skipped}
    assert reasons["step_2.safetensors"] == "step 2 already given by run-2.safetensors"
    assert "run-9.safetensors: not a readable safetensors file" in reasons["run-9.safetensors"]


def test_our_own_checkpoint_sidecars_give_the_losses(tmp_path):
    plain_run(tmp_path, steps=(5,))
    (tmp_path / "run-5.json").write_text(json.dumps({"step": 5, "val_loss": 2.0, "train_loss": 2.5}))
    frame = scan_run_folder(tmp_path).losses()
    pd.testing.assert_frame_equal(
        frame, pd.DataFrame({"step": [5], "val_loss": [2.0], "train_loss": [2.5], "reason": [None]}), check_dtype=False
    )


def test_the_conversion_command_converts_a_torch_saved_state_dict_with_a_tied_head(tmp_path):
    """The command a pickle's skip reason gives, run as a user would, on a state dict saved with ``torch.save``
    whose head is tied to the embedding (shared memory, which ``save_file`` refuses) and with a transposed
    (non-contiguous) tensor. CUDA placement cannot be made on this machine: ``map_location='cpu'`` is run on a
    CPU file here, and is what lets a file saved from CUDA load without it."""
    import shlex
    import subprocess
    import sys

    from safetensors.torch import load_file

    embedding = torch.randn(64, 16)
    state = {"tok_emb.weight": embedding, "head.weight": embedding, "layers.0.attn.proj.weight": torch.randn(16, 16)}
    state["layers.0.mlp.fc1.weight"] = torch.randn(16, 32).T  # stored transposed: not contiguous
    state["layers.0.mlp.fc2.weight"] = torch.randn(16, 32)
    torch.save(state, tmp_path / "step_100.pt")
    (reason,) = [s["reason"] for s in scan_run_folder(tmp_path).skipped]
    command = reason.split("convert it once, where you trust the file: ", 1)[1]
    argv = shlex.split(command)
    assert argv[:2] == ["python", "-c"]
    subprocess.run([sys.executable, *argv[1:]], check=True, capture_output=True, text=True, timeout=120)
    converted = load_file(tmp_path / "step_100.safetensors")
    assert set(converted) == set(state)
    assert all(torch.equal(converted[k], v) for k, v in state.items())
    assert [c.step for c in scan_run_folder(tmp_path).checkpoints] == [100]  # the folder now reads


# ---------------------------------------------------------------------------
# A stranger's folder: every hostile file is a skip with its reason, fast, and the others are kept
# ---------------------------------------------------------------------------


def scan_within(seconds: float, folder, losses_file=None):
    """scan_run_folder in a thread that must finish within ``seconds`` (a hang fails the test, not the run)."""
    import threading

    found = []
    worker = threading.Thread(target=lambda: found.append(scan_run_folder(folder, losses_file)), daemon=True)
    worker.start()
    worker.join(seconds)
    assert found, f"scan_run_folder({folder}) did not return within {seconds} s"
    return found[0]


def peak_rss_growth(fn) -> int:
    """Bytes the process's peak resident memory grew by while ``fn`` ran (Linux: VmHWM reset first)."""
    from pathlib import Path

    def kib(field):
        return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(field))

    before = kib("VmRSS:")
    Path("/proc/self/clear_refs").write_text("5")
    fn()
    return (kib("VmHWM:") - before) * 1024


def test_a_fifo_named_like_a_checkpoint_is_skipped_without_being_opened(tmp_path):
    import os

    plain_run(tmp_path, steps=(0,))
    os.mkfifo(tmp_path / "step_9.safetensors")  # opening it for reading would block forever
    (tmp_path / "checkpoint-5").mkdir()
    os.mkfifo(tmp_path / "checkpoint-5" / "model.safetensors")
    run = scan_within(30, tmp_path)
    assert [c.step for c in run.checkpoints] == [0]
    reasons = {s["revision"]: s["reason"] for s in run.skipped}
    assert reasons["step_9.safetensors"] == (f"{tmp_path / 'step_9.safetensors'}: not a regular file (a FIFO, socket "
                                             "or device; it could block the stage forever): never read")  # fmt: skip
    assert reasons["checkpoint-5"].startswith(f"{tmp_path / 'checkpoint-5' / 'model.safetensors'}: not a regular")
    os.mkfifo(tmp_path / "losses.csv")
    with pytest.raises(RunFolderError, match=r"losses.csv: not a regular file; give a CSV or JSONL file"):
        read_losses(tmp_path / "losses.csv")


def test_a_sparse_file_claiming_an_8_gib_tensor_is_skipped_fast_without_allocating_it(tmp_path):
    import time

    plain_run(tmp_path, steps=(0,))
    sparse_safetensors(tmp_path / "step_7.safetensors", (65536, 32768))  # 8 GiB long, 4 KiB written
    assert (tmp_path / "step_7.safetensors").stat().st_size > 8 * 2**30
    found, start = [], time.monotonic()
    grew = peak_rss_growth(lambda: found.append(scan_within(30, tmp_path)))
    assert time.monotonic() - start < 10 and grew < 256 * 2**20  # it used to be OOM-killed at 24 GB
    (skip,) = found[0].skipped
    assert skip["revision"] == "step_7.safetensors" and skip["step"] == 7
    # which bound speaks first depends on the memory free: 16 GiB of float32 copies, or the holes
    assert "bytes long but only 8,192 stored (a sparse file" in skip["reason"] or "GiB free" in skip["reason"]
    assert [c.step for c in found[0].checkpoints] == [0]


def test_a_tensor_larger_than_the_free_memory_is_skipped_naming_the_sizes(tmp_path):
    sparse_safetensors(tmp_path / "step_3.safetensors", (2**20, 2**18))  # 1 TiB claimed
    (skip,) = scan_within(30, tmp_path).skipped
    assert skip["reason"].startswith(f"{tmp_path / 'step_3.safetensors'}: tensor w [1048576, 262144] needs 2048.0 "
                                     "GiB to read as float32, more than the ")  # fmt: skip


@pytest.mark.parametrize(
    ("state", "why"),
    [
        ('{"global_step": Infinity}', "global_step inf is not a step (an integer from 0 to 2**31-1)"),
        ('{"global_step": 1e30}', "global_step 1e+30 is not a step (an integer from 0 to 2**31-1)"),
        ('{"global_step": "12"}', "global_step '12' is not a step (an integer from 0 to 2**31-1)"),
        ('{"global_step": -3}', "global_step -3 is not a step (an integer from 0 to 2**31-1)"),
        ("[" * 100_000 + "]" * 100_000, "nested deeper than a JSON file here may be"),
    ],
)
def test_a_trainer_state_without_a_usable_step_is_a_skip_with_the_reason(tmp_path, state, why):
    plain_run(tmp_path, steps=(0,))
    folder = tmp_path / "final"  # no step in the name: the trainer state must give it
    folder.mkdir()
    (folder / "model.safetensors").write_bytes((tmp_path / "run-0.safetensors").read_bytes())
    (folder / "trainer_state.json").write_text(state)
    run = scan_within(30, tmp_path)
    assert [c.step for c in run.checkpoints] == [0]
    assert run.skipped == [{"revision": "final", "step": None, "status": "skipped",
                            "reason": f"{folder / 'trainer_state.json'}: {why}"}]  # fmt: skip


def test_a_step_beyond_the_warehouses_32_bit_step_column_is_a_skip_naming_the_file(tmp_path):
    """Steps up to 2**53 passed the scan, though the warehouse's step column is a 32-bit INTEGER."""
    plain_run(tmp_path, steps=(0, 2**31 - 1, 2**31))
    folder = tmp_path / "checkpoint-4294967296"  # a Trainer checkpoint named with the step
    folder.mkdir()
    (folder / "model.safetensors").write_bytes((tmp_path / "run-0.safetensors").read_bytes())
    final = tmp_path / "final"  # no step in the name: its trainer state gives one
    final.mkdir()
    (final / "model.safetensors").write_bytes((tmp_path / "run-0.safetensors").read_bytes())
    (final / "trainer_state.json").write_text('{"global_step": 2147483648}')
    run = scan_within(30, tmp_path)
    assert [c.step for c in run.checkpoints] == [0, 2**31 - 1]
    beyond = "is beyond the warehouse's 32-bit step column (at most 2**31-1); renumber it"
    assert sorted(run.skipped, key=lambda s: s["revision"]) == [
        {"revision": "checkpoint-4294967296", "step": None, "status": "skipped",
         "reason": f"{folder}: step 4,294,967,296 {beyond}"},
        {"revision": "final", "step": None, "status": "skipped",
         "reason": f"{final / 'trainer_state.json'}: global_step 2147483648 is not a step (an integer from 0 to "
                   "2**31-1)"},
        {"revision": "run-2147483648.safetensors", "step": None, "status": "skipped",
         "reason": f"{tmp_path / 'run-2147483648.safetensors'}: step 2,147,483,648 {beyond}"},
    ]  # fmt: skip


def test_losses_that_are_not_numbers_leave_null_losses_with_the_reason(tmp_path):
    history = [{"step": 10, "loss": "NaN-ish", "eval_loss": [1]}, {"step": 10, "eval_loss": float("inf")}]
    (tmp_path / "trainer_state.json").write_text(trainer_state(10, history))
    assert trainer_losses(tmp_path / "trainer_state.json", 10) == (
        None, None, "trainer_state.json logs no eval_loss or loss at step 10 (make logging_steps and eval_steps "
        "divide save_steps)")  # fmt: skip
    (tmp_path / "deep.json").write_text('{"a": ' * 50_000 + "1" + "}" * 50_000)
    val, train, reason = trainer_losses(tmp_path / "deep.json", 10)
    assert (val, train) == (None, None) and reason.endswith("deep.json: nested deeper than a JSON file here may be")


@pytest.mark.parametrize("step", ["ten", "1e30", "-1", "2.5", "", "2147483648"])
def test_a_losses_csv_with_a_step_that_is_not_a_step_names_the_row(tmp_path, step):
    path = tmp_path / "losses.csv"
    path.write_text(f"step,val_loss\n0,4.0\n{step},3.0\n")
    bound = r"is not an integer from 0 to 2\*\*31-1; fix"
    with pytest.raises(RunFolderError, match=rf"losses.csv: step .* \(row 2\) {bound}"):
        read_losses(path)
    path.write_text("step,val_loss\n0,four\n1,3.0\n")
    assert read_losses(path)["val_loss"].isna().tolist() == [True, False]  # a loss that is no number is missing
