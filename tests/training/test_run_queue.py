"""Many runs at once: pool sizing, longest-first order, complete runs skipped untouched, a diverging run
stopping alone, and a real SIGKILL of the whole queue resuming every run bit-identically."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.run_helpers import config, corpus, files
from tests.training.helpers import quiet
from topometrics.features.monitor import RunMonitors
from topometrics.models.bpe import TokenizerError
from topometrics.models.checkpoints import CheckpointError, list_checkpoints
from topometrics.models.model import GPTConfig
from topometrics.models.tokens import load_tokens
from topometrics.params import FeaturesParams, ParamsError, load_params
from topometrics.training.corpus import offline_text
from topometrics.training.live_relay import LiveRelay
from topometrics.training.monitor_log import read_log
from topometrics.training.run_queue import (
    Pool,
    TrainPaths,
    estimated_flops,
    is_complete,
    plan_pool,
    train_declared,
    train_runs,
    usable_cores,
)
from topometrics.training.train import Recipe, RunConfig, recipe_fingerprint, train_run

ROOT = str(Path(__file__).resolve().parents[2])  # the repository: scripts run here import tests.<folder>.helpers


def snapshot(run_dir: Path) -> dict:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(run_dir.iterdir())}


def test_the_pool_fills_the_usable_cores_with_one_thread_each():
    assert plan_pool("cpu", 0, 0, 1000) == Pool(usable_cores(), 1, ("cpu",))
    assert plan_pool("cpu", 0, 0, 1).workers == 1  # never more processes than runs
    assert plan_pool("cpu", 3, 2, 10) == Pool(3, 2, ("cpu",))


def test_the_longest_runs_go_first_and_a_resumed_run_counts_what_is_left():
    shapes = {"tiny": (8, 1), "small": (16, 1), "medium": (24, 2), "large": (32, 3), "xl": (48, 3)}
    cost = {k: estimated_flops(config(hidden=h, layers=n)) for k, (h, n) in shapes.items()}
    assert sorted(cost, key=cost.get) == list(shapes)
    assert estimated_flops(config(steps=40), from_step=30) == pytest.approx(estimated_flops(config(steps=40)) / 4)


def test_the_progress_line_weighs_steps_by_their_cost():
    from topometrics.training.progress import overall_line

    cheap, costly = config(hidden=8, steps=40), config(hidden=48, layers=3, steps=40)
    per_step = {c: estimated_flops(c, 39) for c in (cheap, costly)}
    assert per_step[costly] * 40 == pytest.approx(estimated_flops(costly))  # one step's cost, times the steps
    # the costly run half trained, the cheap one not started: most of the compute is done, not a quarter
    done, total = per_step[costly] * 20, (per_step[costly] + per_step[cheap]) * 40
    line = overall_line(done, total, 0, 2, time.monotonic() - 60)
    share = done / total
    assert share > 0.45 and f"{share:.0%} of the compute to train" in line
    assert f"about {60 * (1 - share) / share / 60:,.1f} min left" in line


def test_runs_train_at_once_a_diverging_run_stops_alone_and_complete_runs_are_skipped_untouched(tmp_path):
    data = corpus(tmp_path / "corpus")
    runs = [
        files(tmp_path, config(seed=1)),
        files(tmp_path, config(seed=2, lr=float("inf"))),
        files(tmp_path, config(seed=3)),
    ]
    summaries = train_runs(runs, data, Pool(2, 1, ("cpu",)), log=quiet)
    assert [summaries[r.config.name]["status"] for r in runs][::2] == ["complete", "complete"]
    assert summaries["t-2"]["status"].startswith("diverged: loss is nan at step")
    metrics = json.loads(runs[0].metrics.read_text())
    assert metrics["final_step"] == 40 and metrics["corpus"] == "python-docs-offline"
    assert runs[0].curve.read_text().splitlines()[-1].startswith("40,")
    assert is_complete(runs[0].config, runs[0].run_dir, "test") and not is_complete(
        runs[1].config, runs[1].run_dir, "test"
    )
    assert not is_complete(config(seed=1, lr=1e-3), runs[0].run_dir, "test")  # another recipe
    assert not is_complete(runs[0].config, runs[0].run_dir, "another corpus")

    before = [snapshot(r.run_dir) for r in runs]
    runs[0].metrics.unlink()  # the stage's reports are rewritten from the run directory
    lines = []
    again = train_runs(runs, data, Pool(2, 1, ("cpu",)), log=lines.append)
    assert "train: 3 runs, 2 complete, 1 to train" in lines[0]
    assert snapshot(runs[0].run_dir) == before[0] and snapshot(runs[2].run_dir) == before[2]
    assert json.loads(runs[0].metrics.read_text()) == metrics
    assert again["t-2"]["status"].startswith("diverged")
    weights = bytearray((runs[2].run_dir / "step_000020.safetensors").read_bytes())
    weights[-1] ^= 1  # one bit of the last tensor: header and size stay whole
    (runs[2].run_dir / "step_000020.safetensors").write_bytes(bytes(weights))
    assert not is_complete(runs[2].config, runs[2].run_dir, "test")  # its sha256 is not the sidecar's


def test_monitored_runs_log_in_their_run_directories_from_pool_processes_and_the_metrics_show_the_last(tmp_path):
    data = corpus(tmp_path / "corpus")
    runs = [files(tmp_path, config(seed=1, steps=20)), files(tmp_path, config(seed=2, steps=20, lr=float("inf")))]
    runs.append(files(tmp_path, config(seed=3, steps=20, variant="wd0")))
    lines = []
    watch = FeaturesParams(max_points=20, workers=1)
    summaries = train_runs(runs, data, Pool(2, 1, ("cpu",)), log=lines.append, observers=[RunMonitors(10, watch)])
    assert summaries["t-2"]["status"].startswith("diverged: loss is nan at step")
    for run, name, steps in zip(runs, ("t-live", "t-live", "t-wd0-live"), ([0, 10, 20], [0], [0, 10, 20]), strict=True):
        features, losses = read_log(run.run_dir / "monitor")  # written by the monitor of a pool process
        assert sorted(features["step"].unique()) == steps, run.config.name
        assert set(features["rung"]) == {name} and set(features["seed"]) == {run.config.recipe.seed}
        last = features[(features["step"] == steps[-1]) & (features["layer"] == "all")].set_index("feature")["value"]
        shown = json.loads(run.metrics.read_text())["monitor"]  # the run JSON's last measurement
        assert shown["step"] == steps[-1] and shown["measurements"] == len(steps)
        assert shown["np_norm"] == last["np_norm"] and shown["vr_tp0"] == last["vr_tp0"]
        assert losses.set_index("step").loc[0, "val_loss"] == list_checkpoints(run.run_dir)[0].meta["val_loss"]
    before = json.loads(runs[0].metrics.read_text())
    runs[0].metrics.unlink()
    train_runs(runs[:1], data, Pool(1, 1, ("cpu",)), log=quiet)  # monitoring off, the run complete: its log stays
    assert json.loads(runs[0].metrics.read_text()) == before


def test_without_monitoring_the_metrics_have_no_monitor_values(tmp_path):
    run = files(tmp_path, config(seed=1, steps=20))
    train_runs([run], corpus(tmp_path / "corpus"), Pool(1, 1, ("cpu",)), log=quiet)
    assert "monitor" not in json.loads(run.metrics.read_text()) and not (run.run_dir / "monitor").exists()


def tsv(path: Path) -> list[tuple[int, float]]:
    """The (step, value) rows of a dvclive metric history (empty while it does not exist)."""
    lines = path.read_text().splitlines()[1:] if path.exists() else []
    return [(int(step), float(value)) for step, value in (line.split("\t") for line in lines)]


def test_a_live_folder_shows_every_run_while_the_queue_trains_and_holds_every_value_once_at_the_end(tmp_path):
    data = corpus(tmp_path / "corpus")
    runs = [files(tmp_path, config(seed=1, steps=200)), files(tmp_path, config(seed=2, steps=20, lr=float("inf")))]
    live = tmp_path / "live"
    watch = FeaturesParams(max_points=20, workers=1)
    args = (runs, data, Pool(2, 1, ("cpu",)), 30.0, quiet, [RunMonitors(50, watch)], live, 0.05)  # relayed every 50 ms
    queue = threading.Thread(target=train_runs, args=args)
    queue.start()
    seen_while_training = []
    while queue.is_alive():
        rows = tsv(live / "plots/metrics/t-1/val_loss.tsv")
        if rows and not runs[0].metrics.exists():  # the run's metrics JSON is written when the queue ends
            seen_while_training.append(rows[-1][0])
        time.sleep(0.02)
    queue.join()
    assert seen_while_training and min(seen_while_training) < 200  # shown before the run had finished

    curve = [(c.step, c.meta["val_loss"]) for c in list_checkpoints(runs[0].run_dir)]
    assert tsv(live / "plots/metrics/t-1/val_loss.tsv") == curve  # every checkpoint once, in order
    features, _ = read_log(runs[0].run_dir / "monitor")
    np_norm = features[(features["layer"] == "all") & (features["feature"] == "np_norm")].sort_values("step")
    measured = list(zip(np_norm["step"], np_norm["value"], strict=True))
    assert tsv(live / "plots/metrics/t-1/np_norm.tsv") == measured and measured[0][0] == 0  # (a step may be skipped)
    summary = json.loads((live / "metrics.json").read_text())
    assert summary["t-1"]["val_loss"] == curve[-1][1] and summary["t-1"]["np_norm"] == np_norm["value"].iloc[-1]
    assert [s for s, _ in tsv(live / "plots/metrics/t-2/val_loss.tsv")] == [0]  # diverged at once: one checkpoint

    # a later queue (nothing to train) relays the finished runs again from the start, each value once
    train_runs(runs[:1], data, Pool(1, 1, ("cpu",)), log=quiet, live=live)
    assert tsv(live / "plots/metrics/t-1/val_loss.tsv") == curve
    assert not (live / "plots/metrics/t-2").exists()
    stale = files(tmp_path, config(seed=1, steps=200, lr=1e-3))  # another recipe in the same run directory
    relay = LiveRelay(tmp_path / "live-stale", {"t-1": (stale.run_dir, recipe_fingerprint(stale.config, "test"))})
    assert relay.poll() == 0  # no checkpoint of this recipe: neither its sidecars nor its monitor log are relayed


KILLED = """
import sys
sys.path.insert(0, {repo!r})  # the repository, for tests.<folder>.helpers
from pathlib import Path
from topometrics.params import FeaturesParams
from topometrics.training.run_queue import Pool, train_runs
from topometrics.features.monitor import RunMonitors
from tests.run_helpers import config, files
from tests.training.helpers import quiet

root = Path({root!r})
runs = [files(root, config(seed=s, steps=200)) for s in (1, 2)]
watch = FeaturesParams(max_points=20)
train_runs(runs, root / "corpus", Pool(2, 1, ("cpu",)), log=quiet, observers=[RunMonitors(20, watch)])
"""


def test_kill_9_of_the_whole_queue_resumes_every_run_bit_identically(tmp_path):
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    data = corpus(killed / "corpus")
    code = KILLED.format(repo=ROOT, root=str(killed))
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)  # its own process group
    marks = [killed / "runs" / name / "step_000060.json" for name in ("t-1", "t-2")]
    # a bound on the wait only (it ends at the first mark): two pool workers and their monitors' fork servers take
    # ~190 s to import torch before step 0 on a loaded 2-core machine, then step 60 comes within seconds
    deadline = time.time() + 400
    while not any(p.exists() for p in marks) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    time.sleep(0.1)  # into the next interval: the kill lands between checkpoints
    os.killpg(proc.pid, signal.SIGKILL)  # the parent and every worker process at once
    proc.wait()
    runs = [files(killed, config(seed=s, steps=200)) for s in (1, 2)]
    done = [max((int(p.stem[5:]) for p in r.run_dir.glob("step_*.json")), default=0) for r in runs]
    assert any(60 <= d < 200 for d in done), f"no run was interrupted mid-way: {done}"  # the other: any state

    # the killed queue's monitor logs (whatever it had finished; possibly nothing under load): no duplicates
    killed_logs = [read_log(r.run_dir / "monitor")[0] for r in runs]
    assert not any(log.duplicated(["step", "layer", "feature"]).any() for log in killed_logs)

    watch = FeaturesParams(max_points=20)
    resumed = train_runs(runs, data, Pool(2, 1, ("cpu",)), log=quiet, observers=[RunMonitors(20, watch)])
    assert {s["status"] for s in resumed.values()} == {"complete"}
    # every measurement in every log, before and after the resume, is a whole layer x feature grid; the
    # resume step is measured again (steps in flight at the kill, or skipped under load, may be missing)
    logs = [read_log(r.run_dir / "monitor")[0] for r in runs]
    sizes = {n for log in killed_logs + logs for n in log.groupby("step").size()}
    assert len(sizes) == 1, sizes
    for log, resumed_at in zip(logs, done, strict=True):
        assert not log.duplicated(["step", "layer", "feature"]).any()
        assert resumed_at == 200 or resumed_at in set(log["step"])  # a run complete at the kill is not resumed
    torch.set_num_threads(1)  # as in the pool's processes
    for r in runs:
        reference = clean / r.config.name
        train_run(r.config, load_tokens(data, "train"), load_tokens(data, "val"), reference, "test", "cpu", quiet)
        wa, wb = (load_file(str(d / "step_000200.safetensors")) for d in (r.run_dir, reference))
        assert all(torch.equal(wa[k], wb[k]) for k in wb)
        assert (r.run_dir / "steps.csv").read_text() == (reference / "steps.csv").read_text()


def test_an_undeclared_run_is_refused_before_any_work(tmp_path):
    params = load_params(Path(__file__).resolve().parents[2] / "params.yaml")
    paths = TrainPaths(tmp_path / "config", tmp_path / "corpus", tmp_path / "runs", tmp_path / "m", tmp_path / "c")
    with pytest.raises(ParamsError, match=r"^--run tiny-1 is not declared in params.yaml; runs are tiny-42, "):
        train_declared(params, paths, only=["tiny-1"], log=quiet)
    assert list(tmp_path.iterdir()) == []


def test_a_token_file_that_is_not_what_the_corpus_stage_recorded_stops_the_queue_before_any_run(tmp_path):
    from topometrics.models.tokens import TokensError

    data = corpus(tmp_path / "corpus")
    record = json.loads((data / "source.json").read_text()) | {"train_tokens": 180_000}
    (data / "source.json").write_text(json.dumps(record))
    (data / "train.u8").write_bytes((data / "train.u8").read_bytes()[:90_000])  # truncated after it was written
    run = files(tmp_path, config(seed=1))
    with pytest.raises(TokensError, match=r"train.u8: 90,000 tokens where source.json records 180,000 \(truncated"):
        train_runs([run], data, Pool(1, 1, ("cpu",)), log=quiet)
    assert not run.run_dir.exists()


def test_kill_9_of_the_queue_alone_leaves_no_training_process_or_monitor_worker_behind(tmp_path):
    """Regression: SIGKILL of the train stage's own process left its training processes and their monitors'
    fork servers running (0.9-2 GB each). Only the queue's process is killed here; the rest must follow it."""
    import psutil

    corpus(tmp_path / "corpus")
    code = KILLED.format(repo=ROOT, root=str(tmp_path)).replace("steps=200", "steps=4000")
    queue = subprocess.Popen([sys.executable, "-c", code])
    family = []
    try:
        deadline = time.time() + 300  # a guard against a hang only
        while True:
            assert queue.poll() is None, "the queue ended before its processes started; nothing was tested"
            family = psutil.Process(queue.pid).children(recursive=True)
            trainers = [p for p in family if p.ppid() == queue.pid and "spawn_main" in " ".join(p.cmdline())]
            if len(trainers) == 2 and any(p.ppid() in {t.pid for t in trainers} for p in family):  # monitors up
                break
            assert time.time() < deadline
            time.sleep(0.05)
    finally:
        queue.send_signal(signal.SIGKILL)
        queue.wait()
    # a monitor's fork server notices its dead trainer only once it has finished importing its preload
    # (torch and the measures): tens of seconds on a loaded 2-core machine, so the wait is generous
    _, alive = psutil.wait_procs(family, timeout=150)
    for leftover in alive:  # so that a failure does not leak them either
        leftover.kill()
    assert not alive, [" ".join(p.cmdline()) for p in alive]


def test_a_full_disk_while_training_is_one_error_line_naming_the_run_and_its_file(tmp_path, tiny_disk):
    import yaml

    repo = Path(__file__).resolve().parents[2]
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["data"] |= {"seq_len": 32, "val_windows": 8}
    params["train"] |= {"steps": 400, "ckpt_every": 10, "batch_size": 8, "warmup": 2, "workers": 1}
    params["ladder"] = {"a": {"hidden": 8, "layers": 1, "heads": 1}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    corpus(tmp_path / "corpus")
    env = os.environ | {"PYTHONPATH": str(repo)}
    subprocess.run([sys.executable, str(repo / "stages/config.py"), "--corpus", "corpus", "--out", "configs"],
                   cwd=tmp_path, env=env, check=True, capture_output=True)  # fmt: skip
    runs = tiny_disk("128k")  # a few checkpoints and their resume states fit, then the disk is full
    cmd = [sys.executable, str(repo / "stages/train.py"), "--configs", "configs", "--corpus", "corpus", "--runs",
           str(runs), "--metrics", "metrics", "--curves", "curves"]  # fmt: skip
    stage = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert stage.returncode == 1 and "Traceback" not in stage.stderr, stage.stderr
    (line,) = stage.stderr.splitlines()
    assert line.startswith(f"error: a-42: {runs / 'a-42'}") and (
        ": no space left on its disk; free space there (or point the output elsewhere) and rerun `dvc repro`" in line
    ), line
    assert list_checkpoints(runs / "a-42"), "the checkpoints written before the disk filled are kept"


# ---------------------------------------------------------------- a BPE corpus


def bpe_corpus(root: Path, vocab: int = 300) -> tuple[Path, dict]:
    """A corpus prepared by the corpus stage with a byte-level BPE of ``vocab`` tokens."""
    from topometrics.params import TokenizerParams
    from topometrics.training.corpus import prepare

    text = offline_text()[:120_000]
    path = root / f"text-{vocab}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    source = prepare(str(path), (), 1, 0.15, root / "corpus", 32, 0.05, TokenizerParams("bpe", vocab))
    return root / "corpus", source


def bpe_config(vocab: int, seed: int = 1) -> RunConfig:
    cfg = config(seed=seed, steps=20)
    return RunConfig(cfg.rung, GPTConfig(vocab_size=vocab, hidden=8, layers=1, heads=1, context=32), cfg.recipe)


def test_a_bpe_run_records_its_tokenizer_and_another_tokenizer_is_refused_before_any_work(tmp_path):
    data, source = bpe_corpus(tmp_path)
    sha = source["tokenizer"]["sha256"]
    run = files(tmp_path, bpe_config(300))
    assert train_runs([run], data, Pool(1, 1, ("cpu",)), log=quiet)["t-1"]["status"] == "complete"
    metas = [c.meta for c in list_checkpoints(run.run_dir)]
    assert {m["tokenizer"] for m in metas} == {sha} and all(m["config"]["vocab_size"] == 300 for m in metas)
    assert metas[-1]["recipe_fingerprint"] == recipe_fingerprint(run.config, source["sha256"], sha)
    assert 0 < metas[-1]["val_bpb"] < metas[0]["val_bpb"]  # learning lowers the loss per byte
    assert metas[-1]["val_bytes"] > metas[-1]["val_tokens"] == 8 * 32  # a BPE token is about two bytes or more
    before = snapshot(run.run_dir)

    other, _ = bpe_corpus(tmp_path / "other", 400)  # another tokenizer under the same run directory
    with pytest.raises(CheckpointError, match=r"t-1 holds checkpoints trained on the BPE whose tokenizer.json"):
        train_runs([files(tmp_path, bpe_config(400))], other, Pool(1, 1, ("cpu",)), log=quiet)
    chars = corpus(tmp_path / "chars")
    with pytest.raises(CheckpointError, match=r"data.tokenizer now gives characters; move it away \(e.g. mv "):
        train_runs([files(tmp_path, config(seed=1, steps=20))], chars, Pool(1, 1, ("cpu",)), log=quiet)
    with pytest.raises(ParamsError, match=r"t-1 has vocab_size 128, the prepared corpus 300; run `dvc repro config`"):
        train_runs([files(tmp_path, config(seed=1, steps=20))], data, Pool(1, 1, ("cpu",)), log=quiet)
    tokenizer_json = data / "tokenizer.json"
    tokenizer_json.write_text(tokenizer_json.read_text().replace("Ġt", "Ġq", 1))  # edited by hand
    with pytest.raises(TokenizerError, match=r"tokenizer.json: content changed after the corpus stage wrote it"):
        train_runs([run], data, Pool(1, 1, ("cpu",)), log=quiet)
    assert snapshot(run.run_dir) == before  # every refusal left the finished run as it was


def test_a_run_whose_first_checkpoint_is_far_off_shows_its_rate_and_eta_before_it(tmp_path):
    """train.steps 1,000,000,000 (a checkpoint every 100,000,000): the queue's StepRate observer logs the steps/s
    and the hours to the next checkpoint and to the end long before any checkpoint (here: after 0.5 s)."""
    from tests.training.helpers import TRAIN, VAL, quiet
    from topometrics.training.progress import StepRate
    from topometrics.training.train import RunConfig, train_run

    lines = []

    class Enough(Exception):
        pass

    class StopAfterTheLine:  # stops the billion-step run once the line is there
        def on_step(self, model, step, loss):
            if lines:
                raise Enough

        def on_checkpoint(self, step, val_loss):
            pass

    recipe = Recipe(10**9, 10**8, 8, 3e-3, 5, 0.0, 0.01, 1.0, 7, 8)
    cfg = RunConfig("big", GPTConfig(hidden=8, layers=1, heads=1, context=32), recipe)
    rate = StepRate("big", recipe.steps, recipe.ckpt_every, every_s=0.5, log=lines.append)
    with pytest.raises(Enough):
        train_run(cfg, TRAIN, VAL, tmp_path, "sha", "cpu", quiet, False, observers=[rate, StopAfterTheLine()])
    (line,) = lines
    assert re.fullmatch(
        r"\[big\] step [\d,]+/1,000,000,000, [\d,.]+ steps/s; checkpoint 100,000,000 in about [\d,.]+ h, "
        r"the end in about [\d,.]+ h",
        line,
    ), line
