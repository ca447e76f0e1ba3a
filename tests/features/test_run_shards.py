"""A run's checkpoints as shards through the execution seam: read back by DuckDB (as the warehouse
reads them) equal to read_tables, equal in a fresh folder, reused when current, the same on a Dask
LocalCluster, and whole after a worker is killed with SIGKILL mid-run."""

import os
import signal
import subprocess
import threading
import time

import pytest
from distributed import Client

from tests.execution.helpers import worker_pids
from tests.features.helpers import PARAMS, STEPS, read_back, run_tables, same_rows, stage_project, write_run
from tests.repo_params import compute_params
from topometrics.execution.cluster import local_cluster
from topometrics.execution.shards import ShardKey
from topometrics.features.sweep import run_shards


def run_features_stage(tmp_path, steps, change) -> subprocess.CompletedProcess:
    """``stages/features.py`` over one run ``tmp_path/runs/tiny-42`` (``stage_project``) with small params, after
    ``change(run_dir)``, into ``tmp_path/out``: the real stage, in its own process."""
    cmd = stage_project(tmp_path, steps, {"workers": 1, "rep_points": 60, "rep_batch": 4, "betti_scales": 4})
    change(tmp_path / "runs" / "tiny-42")
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)


def test_shards_hold_exactly_the_in_memory_tables_and_are_reused(tiny, tmp_path):
    root, features, diagrams = tiny
    out = tmp_path / "shards"
    run = run_shards(root / "run", root / "corpus", PARAMS, out)
    assert sorted(k.step for k in set(run.computed)) == list(STEPS) and not run.failed
    assert (out / "rung=tiny/variant=base/seed=42/step=100/distances.parquet").is_file()
    got_features, got_diagrams = read_back(out)
    same_rows(got_features, features, ["step", "layer", "feature"])
    same_rows(got_diagrams, diagrams, ["step", "source", "layer", "dim", "birth", "death"])
    files = {p: p.stat().st_mtime_ns for p in out.glob("**/*.parquet")}
    again = run_shards(root / "run", root / "corpus", PARAMS, out)
    assert not again.computed and len(set(again.reused)) == len(STEPS)
    assert {p: p.stat().st_mtime_ns for p in out.glob("**/*.parquet")} == files


def test_a_removed_checkpoint_loses_its_shard_and_its_successor_gets_new_distances(tiny, tmp_path):
    root, _, _ = tiny
    out = tmp_path / "shards"
    run_shards(root / "run", root / "corpus", PARAMS, out)
    run_dir = tmp_path / "fewer"
    run_dir.mkdir()
    for step in (0, 200, 300):  # step 100 is gone
        for suffix in (".safetensors", ".json"):
            name = f"step_{step:06d}{suffix}"
            (run_dir / name).write_bytes((root / "run" / name).read_bytes())
    run = run_shards(run_dir, root / "corpus", PARAMS, out)
    assert not ShardKey("tiny", "base", 42, 100).folder(out).exists()
    # 200's distances (its previous is now 0); and 200 and 300 anew, features and distances: every second
    # checkpoint gets the loss surface (features.landscape_every = 2), and the second is now 300, not 200
    assert [k.step for k in run.computed] == [200, 300, 200, 300]
    features, _ = run_tables(run_dir, root / "corpus", tmp_path / "fresh")  # the fewer checkpoints from nothing
    same_rows(read_back(out)[0], features, ["step", "layer", "feature"])


def test_on_a_dask_cluster_with_a_worker_killed_mid_run_nothing_is_missing_or_twice(tiny, tmp_path):
    root, features, diagrams = tiny
    out = tmp_path / "shards"
    with local_cluster(2, memory_limit=None) as cluster, Client(cluster) as client:
        pids = worker_pids(client)
        killed = []

        def kill_a_busy_worker():  # as soon as a worker is running a checkpoint (its first import of torch)
            deadline = time.monotonic() + 60
            while not killed and time.monotonic() < deadline:
                busy = [w for w, tasks in client.processing().items() if tasks]
                if busy:
                    os.kill(pids[busy[0]], signal.SIGKILL)
                    killed.append(busy[0])
                time.sleep(0.02)

        killer = threading.Thread(target=kill_a_busy_worker)
        killer.start()
        run = run_shards(root / "run", root / "corpus", PARAMS, out, compute_params(cluster=cluster.scheduler_address))
        killer.join()
    assert killed, "no worker was killed"
    assert not run.failed
    got_features, got_diagrams = read_back(out)
    assert not got_features.duplicated(["step", "layer", "feature"]).any()
    same_rows(got_features, features, ["step", "layer", "feature"])
    same_rows(got_diagrams, diagrams, ["step", "source", "layer", "dim", "birth", "death"])


def test_a_failed_checkpoint_fails_the_stage_in_one_line_after_the_others_are_written(tmp_path):
    def truncate(run):
        damaged = run / "step_000100.safetensors"
        damaged.write_bytes(damaged.read_bytes()[:100])

    stage = run_features_stage(tmp_path, (0, 100, 200), truncate)
    assert stage.returncode == 1, stage.stderr
    assert "features@tiny-42: 3 checkpoints, 2 computed, 0 already current, 1 failed" in stage.stdout
    (error,) = [line for line in stage.stderr.splitlines() if line.startswith("error: ")]  # the others: progress
    assert error.startswith("error: features@tiny-42: 1 checkpoints failed (step 100: step_000100.safetensors: trunc")
    assert "`dvc repro` recomputes it (the train stage, identically)" in error
    assert error.endswith("; the others are written, re-run to retry them") and "Traceback" not in stage.stderr
    assert sorted(p.parent.name for p in (tmp_path / "out/tiny-42").glob("**/features.parquet")) == [
        "step=0",
        "step=200",
    ]


def test_a_checkpoint_of_another_run_or_step_is_named_with_whose_it_is_and_not_read_by_the_stage(tmp_path):
    """`cp small-42/step_000100.* tiny-42/`: whole, and its hash its own sidecar's, it was read as tiny-42's
    step 100 (and its shard written as small-42's); a checkpoint renamed to another step was read as its sidecar's."""
    import json
    import shutil

    from tests.features.helpers import tiny_model
    from topometrics.models.checkpoints import save_checkpoint, verify_checkpoint

    def copy_in(run):
        theirs = json.loads((run / "step_000100.json").read_text()) | {"rung": "small"}
        save_checkpoint(run, tiny_model(100), {k: v for k, v in theirs.items() if k != "sha256"})  # small-42's
        for suffix in (".safetensors", ".json"):  # step 200 under the name of step 300
            shutil.copy(run / f"step_000200{suffix}", run / f"step_000300{suffix}")

    stage = run_features_stage(tmp_path, (0, 100, 200), copy_in)
    run = tmp_path / "runs" / "tiny-42"
    assert stage.returncode == 1, stage.stderr
    assert "features@tiny-42: 4 checkpoints, 2 computed, 0 already current, 2 failed" in stage.stdout
    (error,) = [line for line in stage.stderr.splitlines() if line.startswith("error: ")]
    assert error == (
        "error: features@tiny-42: 2 checkpoints failed (step 100: step_000100.json: a checkpoint of run small-42, "
        "not of this run tiny-42; delete it (the train stage recomputes this run's)); the others are written, "
        "re-run to retry them"
    )
    out = tmp_path / "out" / "tiny-42"
    shards = sorted(str(p.parent.relative_to(out)) for p in out.glob("**/features.parquet"))
    assert shards == ["rung=tiny/variant=base/seed=42/step=0", "rung=tiny/variant=base/seed=42/step=200"]
    assert verify_checkpoint(run, 300) == (
        "step_000300.json: describes step 200, not step 300 as its name says; delete it (the train stage recomputes "
        "this run's)"
    )


def test_a_checkpoint_changed_after_training_is_named_and_not_read_and_one_without_a_hash_is_read_unverified(tmp_path):
    import json

    from topometrics.models.checkpoints import CheckpointError

    write_run(tmp_path, (0, 100))
    changed = tmp_path / "run" / "step_000100.safetensors"
    weights = bytearray(changed.read_bytes())
    weights[-1] ^= 1  # header and size whole: only the sidecar's sha256 tells
    changed.write_bytes(bytes(weights))
    lines = []
    expected = r"step 100: step_000100.safetensors: content changed after it was written \(sha256 "
    with pytest.raises(CheckpointError, match=expected):
        run_shards(tmp_path / "run", tmp_path / "corpus", PARAMS, tmp_path / "out", progress=lines.append)
    assert sorted(p.parent.name for p in (tmp_path / "out").glob("**/features.parquet")) == ["step=0"]
    assert "2 checkpoints, 1 computed, 0 already current, 1 failed" in lines[-1]
    for sidecar in (tmp_path / "run").glob("step_*.json"):  # as written before sidecars held the hash
        meta = json.loads(sidecar.read_text())
        del meta["sha256"]
        sidecar.write_text(json.dumps(meta))
    lines = []
    run = run_shards(tmp_path / "run", tmp_path / "corpus", PARAMS, tmp_path / "out", progress=lines.append)
    assert lines[0].startswith("features@run: 2 checkpoints (e.g. step_000000.safetensors) have no sha256 in their")
    assert "read unverified; `dvc repro -f train` records it" in lines[0]
    assert {k.step for k in run.reused} == {0} and {k.step for k in run.computed} == {100}


def test_a_resumed_stage_counts_the_checkpoints_it_reuses_as_current_not_computed(tiny, tmp_path):
    """Regression: a stage killed after its checkpoints' shards, before their distances, reported every reused
    checkpoint as computed on the next run (renewing a distance shard counted as computing the checkpoint)."""
    root, _, _ = tiny
    out = tmp_path / "shards"
    run_shards(root / "run", root / "corpus", PARAMS, out)
    for path in out.glob("**/distances.parquet"):  # as a kill between the two passes leaves them
        path.unlink()
    lines = []
    run = run_shards(root / "run", root / "corpus", PARAMS, out, progress=lines.append)
    assert f"{len(STEPS)} checkpoints, 0 computed, {len(STEPS)} already current, 0 failed" in lines[-1]
    assert len(run.computed) == len(STEPS)  # the distance shards, written again
