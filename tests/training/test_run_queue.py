"""Many runs at once: pool sizing, longest-first order, complete runs skipped untouched, a diverging run
stopping alone, and a real SIGKILL of the whole queue resuming every run bit-identically."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.repo_params import features_params
from tests.run_helpers import config, corpus, files
from tests.training.helpers import quiet
from topometrics.execution.compute import usable_cores, whole_job_executor
from topometrics.features.monitor import RunMonitors
from topometrics.models.bpe import TokenizerError
from topometrics.models.checkpoints import CheckpointError, list_checkpoints
from topometrics.models.model import GPTConfig
from topometrics.models.tokens import load_tokens
from topometrics.params import ParamsError, load_params
from topometrics.training import run_queue
from topometrics.training.corpus import offline_text
from topometrics.training.monitor_log import read_log
from topometrics.training.run_queue import (
    Pool,
    TrainPaths,
    estimated_flops,
    is_complete,
    plan_pool,
    train_declared,
    train_runs,
)
from topometrics.training.train import RunConfig, recipe_fingerprint, train_run

ROOT = str(Path(__file__).resolve().parents[2])  # the repository: scripts run here import tests.<folder>.helpers


def snapshot(run_dir: Path) -> dict:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(run_dir.iterdir())}


def test_the_pool_fills_the_usable_cores_with_one_thread_each():
    assert plan_pool("cpu", 0, 0, 1000) == Pool(usable_cores(), 1, ("cpu",))
    assert plan_pool("cpu", 0, 0, 1).workers == 1  # never more processes than runs
    assert plan_pool("cpu", 3, 2, 10) == Pool(3, 2, ("cpu",))


def _process_device(_):
    time.sleep(0.05)  # long enough that every process of the pool takes jobs
    return os.getpid(), run_queue._PROCESS_DEVICE


def test_each_process_of_the_pool_holds_one_device_and_each_device_its_share_of_processes():
    # labels only: nothing runs on them (no GPU here); what is checked is which process holds which
    devices = ("cuda:0", "cuda:1")
    init = (1, os.getpid(), run_queue.process_devices(devices, 4))
    with whole_job_executor(None, 4, run_queue._init_worker, init) as pool:
        held = dict(pool.map(_process_device, range(40)))
    assert sorted(held.values()) == ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]  # one per process, two per GPU


def test_the_longest_runs_go_first_and_a_resumed_run_counts_what_is_left():
    shapes = {"tiny": (8, 1), "small": (16, 1), "medium": (24, 2), "large": (32, 3), "xl": (48, 3)}
    cost = {k: estimated_flops(config(hidden=h, layers=n)) for k, (h, n) in shapes.items()}
    assert sorted(cost, key=cost.get) == list(shapes)
    assert estimated_flops(config(steps=40), from_step=30) == pytest.approx(estimated_flops(config(steps=40)) / 4)


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
    watch = features_params(max_points=20, workers=1)
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


KILLED = """
import sys
sys.path.insert(0, {repo!r})  # the repository, for tests.<folder>.helpers
from pathlib import Path
from tests.repo_params import features_params
from topometrics.training.run_queue import Pool, train_runs
from topometrics.execution.compute import usable_cores
from topometrics.features.monitor import RunMonitors
from tests.run_helpers import config, files
from tests.training.helpers import quiet

root = Path({root!r})
runs = [files(root, config(seed=s, steps=200)) for s in (1, 2)]
watch = features_params(max_points=20)
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

    watch = features_params(max_points=20)
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
