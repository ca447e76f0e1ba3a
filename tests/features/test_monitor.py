"""Live monitoring: background weight features of a model while it trains, its Parquet log, early
stopping, dvclive, a kill -9 in the middle, and a real Hugging Face Trainer run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tests.features.helpers import OneThread, train_steps
from tests.models.helpers import module_weights
from tests.repo_params import PARAMS_YAML, features_params
from topometrics.execution.shards import module_source_hash, params_digest
from topometrics.features import checkpoint
from topometrics.features.monitor import NPPatience, TopologyCallback, TopologyMonitor
from topometrics.models.architectures import config_rules, match_tensors, module_layers, oriented
from topometrics.models.model import GPT, GPTConfig
from topometrics.params import project_params
from topometrics.series.checkpoint import SafetensorsFile
from topometrics.series.run_folders import scan_run_folder
from topometrics.training.corpus import encode
from topometrics.training.monitor_log import measured_with, measurement_parts, read_log

PARAMS = features_params(max_points=20, workers=1)
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "wikitext-2"
SHARED = SHARED if SHARED.exists() else Path("/work/shared/data/wikitext-2")
GIT_ID = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def test_monitor_rows_equal_the_features_of_the_weights_at_each_measured_step(tmp_path):
    model = GPT(GPTConfig(hidden=16, layers=2, heads=2))
    lines, expected = [], {}
    with TopologyMonitor(tmp_path, every=3, params=PARAMS, rung="ours", seed=7, log=lines.append) as m:
        for step, loss in train_steps(model, 9):
            if step % 3 == 0:
                expected[step] = checkpoint.weight_features(module_weights(model), PARAMS)
            m.step(model, step, loss=loss)
    features, losses = read_log(tmp_path)
    assert sorted(features["step"].unique()) == [3, 6, 9] and set(features["rung"]) == {"ours"}
    assert set(features["seed"]) == {7} and list(features.columns) == checkpoint.FEATURE_COLUMNS
    for step, result in expected.items():
        got = features[features["step"] == step]
        want = checkpoint.features_frame(result, "ours", 7, step)
        pd.testing.assert_frame_equal(got.reset_index(drop=True), want, check_dtype=False)
    assert losses["step"].tolist() == [3, 6, 9] and losses["val_loss"].isna().all()
    assert lines[0].startswith("monitor: estimate for ") and "(one thread, per checkpoint): weights " in lines[0]
    assert [line.split(" ")[2] for line in lines[1:]] == ["3", "6", "9"]  # one console line per measurement
    assert lines[1].startswith("monitor: step 3 np_norm ")


def test_a_monitor_given_no_params_measures_with_the_projects_params_yaml(tmp_path):
    with TopologyMonitor(tmp_path / "log", every=1, log=lambda _: None) as monitor:
        assert monitor.params == project_params().features


def test_each_measurement_records_the_code_and_params_that_made_it(tmp_path):
    with TopologyMonitor(tmp_path, every=1, params=PARAMS, log=lambda _: None) as monitor:
        monitor.step(GPT(GPTConfig(hidden=16, layers=1, heads=2)), 0)
    (part,) = measurement_parts(tmp_path)
    made = {"code": module_source_hash("topometrics.features.monitor_measure"), "params": params_digest(PARAMS)}
    assert measured_with(part) == made  # a log measured by other code or params is told apart


def test_training_waits_only_for_the_copy(tmp_path):
    model = GPT(GPTConfig(hidden=32, layers=2, heads=2))
    with TopologyMonitor(tmp_path, every=1, params=features_params(max_points=200), log=lambda _: None) as monitor:
        monitor.step(model, 0)  # starts the worker
        start = time.perf_counter()
        monitor.step(model, 1)
        returned = time.perf_counter() - start
        assert not (tmp_path / "features-000000001.parquet").exists() or returned < 0.5
    assert returned < 0.5  # the features of a step take longer than this on this machine
    assert (tmp_path / "features-000000001.parquet").exists()


def test_a_step_is_skipped_only_when_its_snapshot_would_exceed_the_bytes_in_flight(tmp_path):
    model = GPT(GPTConfig(hidden=32, layers=2, heads=2))
    size = sum(4 * model.get_parameter(layer.tensor).numel() for layer in module_layers(model))
    lines = []
    with TopologyMonitor(tmp_path, 1, features_params(), max_pending_bytes=2 * size, log=lines.append) as monitor:
        assert size == monitor.snapshot_bytes(model) == sum(w.nbytes for w, _ in monitor.snapshot(model).values())
        for step in range(4):  # back to back: no measurement can finish in between
            monitor.step(model, step)
    assert monitor.measured == [0, 1] and monitor.skipped == [2, 3]  # two snapshots fit, then none
    assert lines[1] == "monitor: step 2 not measured, 2 measurements still running"  # after the estimate
    with TopologyMonitor(tmp_path / "big", 1, features_params(), max_pending_bytes=1, log=lines.append) as monitor:
        monitor.step(model, 0)  # one snapshot always goes, however large
    assert monitor.measured == [0]


def test_the_worker_starts_with_the_monitor_before_any_step(tmp_path):
    with TopologyMonitor(tmp_path / "log", every=1, params=features_params(), log=lambda _: None) as monitor:
        deadline = time.time() + 60
        while not monitor._pool._processes and time.time() < deadline:  # started in the background
            time.sleep(0.01)
        assert monitor._pool._processes  # so the first measured step does not wait for it
    assert not (tmp_path / "log").exists()  # no step, no log folder


def test_np_early_stopping_stops_when_np_stops_rising_and_records_why(tmp_path):
    model = GPT(GPTConfig(hidden=16, layers=1, heads=2))  # never trained: NP is the same every time
    monitor = TopologyMonitor(tmp_path, every=1, params=PARAMS, patience=2, min_delta=0.0, log=lambda _: None)
    for step in range(4):
        monitor.step(model, step)
    monitor.close()
    record = json.loads((tmp_path / "stop.json").read_text())
    # step 0 sets the best (NP > 0); steps 1 and 2 do not beat it: the counter reaches 2 at step 2
    assert record["step"] == 2 and record["best_step"] == 0
    assert monitor.stop_reason.startswith("NP early stopping at step 2: NP has not risen above")
    assert monitor.should_stop


def test_np_patience_counts_the_measurements_that_do_not_beat_the_best_by_min_delta():
    state = NPPatience().after(0, 0.5, 0.1)
    assert state == NPPatience(0.5, 0, 0)  # above the starting best, 0
    state = state.after(1, 0.55, 0.1).after(2, float("nan"), 0.1)  # not above 0.5 + 0.1; a NULL NP
    assert state == NPPatience(0.5, 0, 2)
    assert state.after(3, 0.7, 0.1) == NPPatience(0.7, 3, 0)


def test_with_live_it_logs_through_dvclive_and_never_touches_dvc_yaml(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dvc_yaml = "stages:\n  train:\n    cmd: python train.py\n"
    Path("dvc.yaml").write_text(dvc_yaml)
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "init"]):
        subprocess.run(cmd, check=True, env=os.environ | GIT_ID)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))  # what dvc repro / dvc exp run set for a stage's command
    model = GPT(GPTConfig(hidden=16, layers=1, heads=2))
    with TopologyMonitor(tmp_path / "plain", every=1, params=PARAMS, log=lambda _: None) as monitor:
        monitor.step(model, 0)
    assert not (tmp_path / "plain" / "dvclive").exists()  # only when asked: the environment is not read
    with TopologyMonitor(tmp_path / "log", every=1, params=PARAMS, live=True, log=lambda _: None) as monitor:
        for step, loss in train_steps(model, 2):
            monitor.step(model, step, loss=loss)
    assert Path("dvc.yaml").read_text() == dvc_yaml
    metrics = json.loads((tmp_path / "log" / "dvclive" / "metrics.json").read_text())
    assert metrics["step"] == 2 and metrics["monitor"]["np_norm"] > 0
    tsv = pd.read_csv(tmp_path / "log" / "dvclive" / "plots" / "metrics" / "monitor" / "np_norm.tsv", sep="\t")
    assert tsv["step"].tolist() == [1, 2]
    assert not list(tmp_path.glob("log/**/dvc.yaml"))


def test_sinks_get_each_measurement_and_a_raising_sink_is_one_warning_and_training_goes_on(tmp_path):
    model, got, lines = GPT(GPTConfig(hidden=16, layers=1, heads=2)), [], []

    def broken(step, values):
        raise ConnectionError("tracker offline")

    with TopologyMonitor(tmp_path, every=2, params=PARAMS, log=lines.append, sink=broken) as monitor:
        monitor.sinks.append(lambda step, values: got.append((step, values)))
        for step, loss in train_steps(model, 6):
            monitor.step(model, step, loss=loss)
    features, _ = read_log(tmp_path)
    model_level = features[features["layer"] == "all"].dropna(subset=["value"])
    want = {s: dict(zip(g["feature"], g["value"], strict=True)) for s, g in model_level.groupby("step")}
    assert [step for step, _ in got] == [2, 4, 6]
    assert all(values == pytest.approx(want[step]) for step, values in got)
    warnings = [line for line in lines if "warning" in line]
    assert warnings == [
        f"monitor: warning: sink {broken.__qualname__} raised ConnectionError: tracker offline at step 2; "
        f"training goes on, measurements still go to {tmp_path} (further errors not shown)"
    ]
    assert monitor.measured == [2, 4, 6]


UNGUARDED = """
from topometrics.features.monitor import TopologyMonitor
def monitored():
    return TopologyMonitor("{log}", every=1)  # the project's params.yaml
monitor = monitored()
print("trained")
"""


def test_a_script_without_the_main_guard_fails_in_one_line_saying_what_to_add(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED.format(log=tmp_path / "log"))
    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and done.stdout == "" and not (tmp_path / "log").exists()
    assert done.stderr.splitlines() == [
        f"error: {script}:5: a worker process re-imports this script and would run it again; put the code that "
        'trains (from this line on) under `if __name__ == "__main__":` and run it again'
    ]
    # under the guard the same monitor runs: test_kill_9_leaves_only_complete_files's script has it


KILLED = """
import dataclasses, sys, torch
from topometrics.models.model import GPT, GPTConfig
from topometrics.features.monitor import TopologyMonitor
from topometrics.params import load_params
if __name__ == "__main__":
    model = GPT(GPTConfig(hidden=48, layers=3, heads=4))
    params = dataclasses.replace(load_params(sys.argv[2]).features, max_points=40)
    monitor = TopologyMonitor(sys.argv[1], every=1, params=params)
    step = 0
    while True:
        step += 1
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.001)
        monitor.step(model, step, loss=1.0)
"""


def test_kill_9_leaves_only_complete_files(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(KILLED)
    log = tmp_path / "log"
    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, str(script), str(log), str(PARAMS_YAML)], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(list(log.glob("features-*.parquet"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)  # the training process only; its worker is orphaned
        proc.wait()
        time.sleep(1.0)  # the orphaned worker may finish a file or be stopped mid-write
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # then the worker and the fork server it came from
    (log / ".features-000999999.parquet.123.tmp").write_bytes(b"PAR1 half a file")  # a write cut short
    features, losses = read_log(log)
    steps = sorted(features["step"].unique())
    assert len(steps) >= 3
    rows = features.groupby("step").size()
    assert (rows == rows.iloc[0]).all()  # every file holds every row of its measurement
    assert features["value"].notna().all()
    assert set(losses["step"]) >= set(steps)


# ---------------------------------------------------------------------------
# A real Hugging Face Trainer run
# ---------------------------------------------------------------------------


def trainer_run(out: Path, steps: int = 200, every: int = 50, report_to=()):
    """A tiny GPT-2 trained by transformers.Trainer on WikiText-2 characters, with the callback logging
    through the Trainer (to the ``report_to`` integrations)."""
    pytest.importorskip("accelerate", reason="the Hugging Face Trainer needs accelerate, not installed here")
    if not SHARED.exists():
        pytest.skip("../shared/data/wikitext-2 is absent on this machine")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    ids = torch.from_numpy(encode((SHARED / "wiki.valid.tokens").read_text()[:300_000]).astype(np.int64))
    windows = ids[: (ids.numel() // 64) * 64].view(-1, 64)
    train = [{"input_ids": w, "labels": w} for w in windows[:-32]]
    held = [{"input_ids": w, "labels": w} for w in windows[-32:]]
    torch.manual_seed(0)  # the Trainer seeds globally itself as well (args.seed)
    model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=128, n_positions=64))
    args = TrainingArguments(
        output_dir=str(out / "run"), max_steps=steps, per_device_train_batch_size=8, learning_rate=3e-3,
        save_steps=50, logging_steps=50, eval_strategy="steps", eval_steps=50, report_to=list(report_to), use_cpu=True,
        disable_tqdm=True, dataloader_num_workers=0, seed=0,
    )  # fmt: skip
    monitor = TopologyMonitor(out / "live", every=every, params=PARAMS, rung="gpt2-live", log=lambda _: None)
    threads = torch.get_num_threads()
    try:
        trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=held, callbacks=[OneThread()])
        trainer.add_callback(TopologyCallback(monitor, trainer))
        trainer.train()
    finally:
        torch.set_num_threads(threads)
    return out / "run", out / "live", trainer.state.log_history


def test_trainer_callback_logs_what_the_saved_checkpoints_hold_and_the_trainers_tensorboard_gets_it(
    tmp_path, monkeypatch
):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))  # report_to's own TensorBoardCallback
    run_dir, live, history = trainer_run(tmp_path, report_to=["tensorboard"])
    features, losses = read_log(live)
    everything = features[features["layer"] == "all"].dropna(subset=["value"])
    logged = {(int(e["topology/step"]), k[len("topology/") :]): v for e in history for k, v in e.items()
              if "topology/step" in e and k != "topology/step" and k.startswith("topology/")}  # fmt: skip
    assert logged == {(int(r.step), r.feature): pytest.approx(r.value) for r in everything.itertuples()}
    # the event file TensorBoard wrote, read back by its own reader (the integration prefixes train/)
    (events,) = (tmp_path / "tb").glob("events.out.tfevents.*")
    board = EventAccumulator(str(events))
    board.Reload()
    steps = [round(e.value) for e in board.Scalars("train/topology/step")]
    assert steps == [50, 100, 150, 200]  # every measurement, in order, before the writer closed
    np_norm = everything[everything["feature"] == "np_norm"].set_index("step")["value"]
    got = [e.value for e in board.Scalars("train/topology/np_norm")]
    assert got == pytest.approx(np_norm.loc[steps].tolist(), rel=1e-6)  # float32 in the event file
    assert sorted(features["step"].unique()) == [50, 100, 150, 200]
    run = scan_run_folder(run_dir)
    assert [c.step for c in run.checkpoints] == [50, 100, 150, 200] and run.skipped == []
    table = run.losses()
    assert table["val_loss"].notna().all() and table["train_loss"].notna().all()
    for ckpt in run.checkpoints:
        shard = SafetensorsFile(ckpt.weights[0])
        shapes = {name: tuple(shard.header[name]["shape"]) for name in shard.names}
        layers = match_tensors(shapes, config_rules(ckpt.config_dir), ckpt.revision)
        weights = {la.name: oriented(shard.read(la.tensor), la.transposed) for la in layers}
        want = checkpoint.features_frame(checkpoint.weight_features(weights, PARAMS), "gpt2-live", 0, ckpt.step)
        got = features[features["step"] == ckpt.step].reset_index(drop=True)
        pd.testing.assert_frame_equal(got, want, check_dtype=False)  # the monitor saw the saved weights
        # and the monitor's losses are the Trainer's own logs at that step
        logged = losses.set_index("step").loc[ckpt.step]
        assert logged["val_loss"] == pytest.approx(table.set_index("step").loc[ckpt.step, "val_loss"])


def test_a_measurement_logged_at_a_logging_step_keeps_the_trainers_own_loss_row(tmp_path):
    # Trainer.log clears control.should_log; the callback waits for (and logs) the last step's measurement
    # in on_step_end, after the flow callback set the flag, so the Trainer used to skip that step's loss
    pytest.importorskip("accelerate", reason="the Hugging Face Trainer needs accelerate, not installed here")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    windows = torch.randint(0, 32, (8, 8), generator=torch.Generator().manual_seed(0))
    model = GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=32, n_positions=8))
    args = TrainingArguments(
        output_dir=str(tmp_path / "run"), max_steps=2, per_device_train_batch_size=4, logging_steps=2,
        save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0,
    )  # fmt: skip
    threads = torch.get_num_threads()
    with TopologyMonitor(tmp_path / "live", every=2, params=PARAMS, log=lambda _: None) as monitor:
        try:
            train = [{"input_ids": w, "labels": w} for w in windows]
            trainer = Trainer(model=model, args=args, train_dataset=train, callbacks=[OneThread()])
            trainer.add_callback(TopologyCallback(monitor, trainer))
            trainer.train()
        finally:
            torch.set_num_threads(threads)
    history = trainer.state.log_history
    assert [e["step"] for e in history if "topology/step" in e] == [2]
    assert [e["step"] for e in history if "loss" in e] == [2]  # the Trainer's own row of the same step
    _, losses = read_log(tmp_path / "live")
    assert losses["step"].tolist() == [2] and losses["train_loss"].notna().all()


def test_a_diverged_snapshot_gives_null_rows_with_the_reason(tmp_path):
    model = GPT(GPTConfig(hidden=16, layers=1, heads=2))
    with torch.no_grad():
        model.blocks[0].mlp.up.weight[0, 0] = float("nan")
    with TopologyMonitor(tmp_path, every=1, params=PARAMS, patience=1, log=lambda _: None) as monitor:
        monitor.step(model, 1)
    features, _ = read_log(tmp_path)
    healthy = checkpoint.weight_features(module_weights(GPT(GPTConfig(hidden=16, layers=1, heads=2))), PARAMS)
    assert set(zip(features["layer"], features["feature"], strict=True)) == {row[:2] for row in healthy.rows}
    assert features["value"].isna().all()
    assert set(features["reason"]) == {"diverged: non-finite weights in a linear layer"}
    assert monitor.should_stop  # a NULL NP is no improvement


@pytest.mark.slow
def test_dvc_repro_ingests_a_trainer_run_folder_and_its_live_log(tmp_path):
    import duckdb
    import yaml

    from tests.pipeline.helpers import commit, make_project, run

    run_dir, live, _ = trainer_run(tmp_path)
    project = make_project(tmp_path / "project")
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["series"] = {"seq_len": 16, "sources": {"gpt2-run": {"path": str(run_dir)}, "gpt2-live": {"log": str(live)}}}
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    commit(project, "external runs")
    out = run(["dvc", "repro"], project)
    assert "series gpt2-run: 4 computed, 0 reused, 0 skipped" in out
    assert "series gpt2-live: 4 computed, 0 reused, 0 skipped" in out
    with duckdb.connect(str(project / "data/warehouse.duckdb"), read_only=True) as con:
        kinds = dict(con.execute("SELECT rung, kind FROM runs WHERE rung LIKE 'gpt2-%'").fetchall())
        assert kinds == {"gpt2-run": "series", "gpt2-live": "series"}
        losses = con.execute("SELECT rung, count(val_loss), count(train_loss) FROM checkpoints "
                             "WHERE rung LIKE 'gpt2-%' GROUP BY rung ORDER BY rung").fetchall()  # fmt: skip
        assert losses == [("gpt2-live", 4, 4), ("gpt2-run", 4, 4)]
        for view in ("feature_loss_spearman", "np_series", "phases", "early_stopping"):
            rungs = {r[0] for r in con.execute(f"SELECT DISTINCT rung FROM {view}").fetchall()}
            assert {"gpt2-run", "gpt2-live"} <= rungs, view
        rho = con.execute("SELECT rho FROM feature_loss_spearman WHERE rung = 'gpt2-live' AND layer = 'all' "
                          "AND feature = 'w_fro'").fetchone()  # fmt: skip
        assert rho is not None and -1 <= rho[0] <= 1


@pytest.mark.slow
def test_dvc_exp_run_with_monitor_every_relays_the_monitor_live_and_the_warehouse_ingests_it(tmp_path):
    import csv

    import duckdb
    import yaml

    from tests.pipeline.helpers import REPO, commit, make_project, run

    project = make_project(tmp_path / "project")
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["series"]["sources"] = {}
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    commit(project, "no hub series")
    run(["dvc", "repro", "train"], project)  # the defaults: no monitor, no monitor values
    assert "monitor" not in json.loads((project / "reports/train/a-42.json").read_text())
    assert not (project / "data/runs/a-42/monitor").exists()
    commit(project, "trained")

    # monitoring is not part of the recipe: complete runs stay complete (nothing retrained, nothing monitored)
    out = run(["dvc", "exp", "run", "-S", "train.monitor_every=10", "train"], project)
    assert "train: 2 runs, 2 complete, 0 to train" in out and "monitor: step" not in out
    out = run(["dvc", "exp", "run", "-S", "train.monitor_every=10", "-S", "train.steps=60", "train"], project)
    # what each run's monitor measured: steps 0, 10, ..., 60, less any it skipped under load (it never
    # makes training wait: a step whose snapshot would exceed max_pending_bytes in flight is skipped, with a line)
    logs = {name: read_log(project / f"data/runs/{name}/monitor")[0] for name in ("a-42", "b-42")}
    measured = {name: sorted(log["step"].unique()) for name, log in logs.items()}
    for name, steps in measured.items():
        assert steps[0] == 0 and len(steps) >= 2 and set(steps) <= set(range(0, 61, 10)), (name, steps)
        assert f"[{name}] monitor: step {steps[-1]} np_norm" in out
        skipped = sorted(set(range(0, 61, 10)) - set(steps))
        assert all(f"[{name}] monitor: step {s} not measured" in out for s in skipped)
    # each run's last measurement is in its JSON, an output (a metric per run would widen `dvc exp show` per run)
    last = {name: json.loads((project / f"reports/train/{name}.json").read_text())["monitor"] for name in logs}
    assert last["a-42"]["step"] == measured["a-42"][-1] and last["b-42"]["measurements"] == len(measured["b-42"])
    assert last["a-42"]["np_norm"] > 0
    header = next(csv.reader([run(["dvc", "exp", "show", "--no-pager", "--csv"], project).splitlines()[0]]))
    assert not [c for c in header if ("a-42" in c or "b-42" in c) and not c.startswith("data/")], header
    assert not (project / "data/runs/a-42/monitor/dvclive").exists()  # nothing beside the log in data/runs
    # the dvclive folder the stage relays into while the runs train: the same values, and a plot per run
    live = json.loads((project / "reports/live/metrics.json").read_text())
    assert live["a-42"]["np_norm"] == pytest.approx(last["a-42"]["np_norm"]) and live["b-42"]["val_loss"] > 0
    relayed = (project / "reports/live/plots/metrics/a-42/val_loss.tsv").read_text().splitlines()[1:]
    curve = (project / "reports/curves/a-42.csv").read_text().splitlines()[1:]
    assert [line.split("\t")[0] for line in relayed] == [line.split(",")[0] for line in curve]  # this recipe's
    plots = json.loads(run(["dvc", "plots", "show", "--json", "reports/live/plots/metrics"], project))
    assert "errors" not in plots, plots["errors"]
    shown = {"reports/live/plots/metrics/a-42/np_norm.tsv", "reports/live/plots/metrics/b-42/val_loss.tsv"}
    assert shown <= set(plots["data"])
    dvc_yaml = (project / "dvc.yaml").read_text()
    assert dvc_yaml == (REPO / "dvc.yaml").read_text()  # dvclive never rewrites it

    # a run's log as a series: the live rows equal the features stage's rows of the checkpoint at that step
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["series"]["sources"] = {"a-live": {"log": "data/runs/a-42/monitor", "seed": 42}}
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    n = len(measured["a-42"])
    assert f"series a-live: {n} computed, 0 reused, 0 skipped" in run(["dvc", "repro"], project)
    with duckdb.connect(str(project / "data/warehouse.duckdb"), read_only=True) as con:
        pairs = con.execute(
            "SELECT l.value, r.value FROM features l JOIN features r USING (step, layer, feature, seed) "
            "WHERE l.rung = 'a-live' AND r.rung = 'a' AND layer = 'all' AND feature = 'np_norm' ORDER BY step"
        ).fetchall()
        assert len(pairs) == n and all(live == pytest.approx(ours) for live, ours in pairs)
        assert con.execute("SELECT count(val_loss) FROM checkpoints WHERE rung = 'a-live'").fetchone() == (n,)


USER_TRAINING = """
import dataclasses
from pathlib import Path
import torch
from topometrics.models.model import GPT, GPTConfig
from topometrics.features.monitor import TopologyMonitor
from topometrics.params import load_params

if __name__ == "__main__":
    features = dataclasses.replace(load_params("PARAMS_YAML").features, max_points=20)
    torch.manual_seed(0)
    model = GPT(GPTConfig(hidden=16, layers=1, heads=1, context=16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with TopologyMonitor(Path("monitor"), every=10, params=features, live=True) as monitor:
        for step in range(1, 31):
            x = torch.randint(0, 128, (4, 16))
            loss = model.loss(x, x)
            opt.zero_grad()
            loss.backward()
            opt.step()
            monitor.step(model, step, loss=loss.item())
"""

USER_DVC_YAML = """stages:
  train:
    cmd: python train.py
    deps:
    - train.py
    metrics:
    - monitor/dvclive/metrics.json: {cache: false}
    plots:
    - monitor/dvclive/plots/metrics: {cache: false, x: step}
"""


@pytest.mark.slow
def test_in_a_users_own_dvc_experiment_the_monitor_shows_in_exp_show_and_plots_as_docs_series_says(tmp_path):
    import csv

    from tests.pipeline.helpers import commit, run

    project = tmp_path / "user"
    project.mkdir()
    (project / "train.py").write_text(USER_TRAINING.replace("PARAMS_YAML", str(PARAMS_YAML)))
    (project / "dvc.yaml").write_text(USER_DVC_YAML)
    for args in (["git", "init", "-q"], ["git", "config", "user.email", "t@t.invalid"],
                 ["git", "config", "user.name", "t"], ["dvc", "init", "-q"]):  # fmt: skip
        run(args, project)
    commit(project, "a user's training script")
    run(["dvc", "exp", "run"], project)
    assert (project / "dvc.yaml").read_text() == USER_DVC_YAML  # dvclive never rewrites it
    rows = list(csv.DictReader(run(["dvc", "exp", "show", "--no-pager", "--csv"], project).splitlines()))
    workspace = next(r for r in rows if r["rev"] == "workspace")
    features, losses = read_log(project / "monitor")
    last = features[(features["step"] == 30) & (features["layer"] == "all")].set_index("feature")["value"]
    assert float(workspace["monitor.np_norm"]) == pytest.approx(last["np_norm"])
    assert float(workspace["monitor.train_loss"]) == pytest.approx(losses.set_index("step").loc[30, "train_loss"])
    plots = json.loads(run(["dvc", "plots", "show", "--json", "monitor/dvclive/plots/metrics"], project).split("\n")[0])
    assert "errors" not in plots
    assert "monitor/dvclive/plots/metrics/monitor/np_norm.tsv" in plots["data"]
