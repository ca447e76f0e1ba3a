"""Training on a Dask cluster of real `dask scheduler` and `dask worker` processes started here (loopback,
stopped by their own process ids): every run bit-identical to the same run trained locally, also when a
worker is SIGKILLed mid-run; a scheduler that goes away stops the queue in one line; addresses that answer
but are not a scheduler, a missing GPU resource and a folder the workers cannot see are one-line errors."""

import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.repo_params import compute_params
from tests.run_helpers import config, corpus, files, free_port
from topometrics.execution.cluster import ClusterError, connect
from topometrics.execution.compute import whole_job_executor
from topometrics.training.run_queue import Pool, train_runs

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def start(args: list[str], log: Path) -> subprocess.Popen:
    """A dask CLI process in its own process group, running this checkout's code."""
    env = dict(os.environ, PYTHONPATH=str(REPO), DASK_DISTRIBUTED__WORKER__DAEMON="False")
    dask = Path(sys.executable).parent / "dask"
    with log.open("w") as out:
        return subprocess.Popen([str(dask), *args], stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)  # its own group, started here
    proc.wait()


def wait_for_workers(address: str, n: int) -> None:
    from distributed import Client

    with Client(address, timeout=60, set_as_default=False) as client:
        client.wait_for_workers(n, timeout=120)


@pytest.fixture
def dask_cluster(tmp_path):
    """A scheduler and two single-threaded workers on 127.0.0.1; yields (address, workers, scheduler)."""
    address = f"tcp://127.0.0.1:{free_port()}"
    port = address.rsplit(":", 1)[1]
    scheduler = start(["scheduler", "--host", "127.0.0.1", "--port", port, "--no-dashboard"], tmp_path / "s.log")
    # No nanny: the worker is the process started here, so killing it kills the worker (a nanny's child survives it)
    worker = ["worker", address, "--nthreads", "1", "--no-dashboard", "--host", "127.0.0.1", "--no-nanny"]
    workers = [start(worker, tmp_path / f"w{i}.log") for i in range(2)]
    try:
        wait_for_workers(address, 2)
        yield address, workers, scheduler
    finally:
        for proc in [*workers, scheduler]:
            stop(proc)


def checkpoints(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run_dir.glob("step_*.safetensors"))}


def test_runs_on_the_cluster_equal_local_runs_even_after_a_worker_is_killed_mid_run(tmp_path, dask_cluster):
    address, workers, _ = dask_cluster
    data = corpus(tmp_path / "corpus")
    cfgs = [config(seed=s, steps=120) for s in (1, 2, 3, 4)]  # a checkpoint every 20 steps
    local = [files(tmp_path / "local", c) for c in cfgs]
    train_runs(local, data, Pool(2, 1, ("cpu",)), log=lambda line: None)

    remote = [files(tmp_path / "cluster", c) for c in cfgs]
    killed = []

    def kill_a_worker_mid_run():  # once some run has a checkpoint and none is complete, both workers are busy
        deadline = time.time() + 1800  # a guard against a hang only: a loaded machine is slow to start workers
        while time.time() < deadline and not killed:
            dirs = [r.run_dir for r in remote]
            if any((d / "step_000020.json").exists() for d in dirs) and not any(
                (d / "checkpoints.csv").exists() for d in dirs
            ):
                stop(workers[0])
                killed.append(time.time())
            time.sleep(0.05)

    killer = threading.Thread(target=kill_a_worker_mid_run)
    killer.start()
    lines = []
    summaries = train_runs(remote, data, Pool(4, 1, ("cpu",), compute_params(cluster=address)), log=lines.append)
    killer.join()
    assert killed, "no worker was killed mid-run; nothing was tested"
    assert "on the Dask cluster at " + address in lines[0]
    assert all(s["status"] == "complete" for s in summaries.values()), summaries
    for a, b in zip(local, remote, strict=True):
        assert checkpoints(b.run_dir) == checkpoints(a.run_dir) and len(checkpoints(a.run_dir)) == 7


def test_a_scheduler_that_goes_away_stops_the_queue_in_one_line_and_finished_runs_stay(tmp_path, dask_cluster):
    address, _, scheduler = dask_cluster
    data = corpus(tmp_path / "corpus")
    # Two runs on two workers: both start at once (three would queue the short one behind a long one, longest
    # first, and every run would end before the scheduler is stopped), so the long one is mid-run when it goes.
    runs = [files(tmp_path, config(seed=s, steps=40 if s == 1 else 4000)) for s in (1, 2)]
    long_run_unfinished = []

    def stop_scheduler_after_the_short_run():
        deadline = time.time() + 1800  # a guard only
        while time.time() < deadline and not (runs[0].run_dir / "checkpoints.csv").exists():
            time.sleep(0.05)
        long_run_unfinished.append(not (runs[1].run_dir / "checkpoints.csv").exists())
        stop(scheduler)

    stopper = threading.Thread(target=stop_scheduler_after_the_short_run)
    stopper.start()
    pool = Pool(2, 1, ("cpu",), compute_params(cluster=address, connect_timeout_s=2))
    try:
        with pytest.raises(ClusterError) as err:
            train_runs(runs, data, pool, log=lambda x: None)
    finally:
        stopper.join()
    assert long_run_unfinished == [True], "the long run had ended before the scheduler went; nothing was tested"
    message = str(err.value)
    assert message.startswith(f"the Dask scheduler at {address} went away;") and "\n" not in message
    assert (runs[0].run_dir / "checkpoints.csv").is_file() and (runs[0].run_dir / "summary.json").is_file()


def test_an_http_server_as_the_scheduler_fails_within_the_connect_timeout_naming_the_address():
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"tcp://127.0.0.1:{server.server_address[1]}"
    start_s = time.monotonic()
    try:
        with pytest.raises(ClusterError) as err, connect(address, timeout_s=1):
            pytest.fail("an HTTP server was taken for a scheduler")
    finally:
        server.shutdown()
    assert time.monotonic() - start_s < 5
    assert str(err.value).startswith(f"{address} answers but is not a Dask scheduler") and "\n" not in str(err.value)


def test_a_missing_gpu_resource_and_an_unseen_folder_are_one_line_errors_before_any_run(tmp_path, dask_cluster):
    address, _, _ = dask_cluster
    compute = compute_params(cluster=address)
    gpu = {"resources": {"GPU": 0.25}}
    missing = "no worker of the Dask scheduler at .* declares the GPU resource"
    with pytest.raises(ClusterError, match=missing), whole_job_executor(compute, 1, print, (), **gpu):
        pytest.fail("a GPU run was queued on a cluster without GPU workers")
    unseen = tmp_path / "not-shared"  # exists on no worker's filesystem
    unseen_line = f"the Dask worker tcp://127.0.0.1:\\d+ of {address} cannot see {unseen};"
    with pytest.raises(ClusterError, match=unseen_line), whole_job_executor(compute, 1, print, (), visible=[unseen]):
        pytest.fail("a folder the workers cannot see was accepted")
