"""SLURM with dask-jobqueue (docs/scaling.md, "SLURM with dask-jobqueue").

End to end: a one-node SLURM on loopback (munged, slurmctld and slurmd of Debian's slurm-wlm, started here with
their own key, socket, config, ports and state in a temporary folder, stopped by the process ids started here);
a ``dask_jobqueue.SLURMCluster`` writes a scheduler file and submits two worker jobs (``--gres=gpu:1`` each, a
Dask ``GPU=1`` resource each); ``compute.cluster`` names that file, and two runs trained there, each declaring
a whole GPU, are bit-identical to the same runs trained locally.

Without daemons: the job script the SLURMCluster of docs/scaling.md submits is the one the page shows.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.repo_params import compute_params
from tests.run_helpers import config, corpus, files, free_port
from topometrics.training.run_queue import Pool, train_runs

REPO = Path(__file__).resolve().parents[2]
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scancel")


def checkpoints(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run_dir.glob("step_*.safetensors"))}


SLURM_CONF = """\
ClusterName=topometrics
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.sock
SlurmUser=root
SlurmdUser=root
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
GresTypes=gpu
NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 RealMemory=8000 Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


def start(args: list[str], log: Path, env: dict) -> subprocess.Popen:
    """A daemon in the foreground, in its own process group."""
    with log.open("w") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # its own group, started here
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def slurm_cli(args: list[str]) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=True, timeout=30).stdout


@pytest.fixture
def slurm(monkeypatch):
    """A one-node SLURM (partition debug, node localhost: 2 CPUs, 2 count-only GPUs) on loopback; yields its folder.

    SLURM_CONF names its config for this test's sbatch/squeue (and dask-jobqueue's). The GPUs are two empty files
    (slurmd logs that they are not devices, and schedules them anyway): ``--gres=gpu:1`` is allocated, nothing
    uses a device. Every job still queued at the end is cancelled before the daemons are stopped.
    """
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        pytest.skip(f"no {', '.join(missing)} on PATH: apt-get install slurmctld slurmd munge")
    if os.geteuid() != 0:
        pytest.skip("slurmd runs batch jobs as their user: it must run as root")
    root = Path(tempfile.mkdtemp(prefix="slurm-"))  # short: the munge socket path is at most 107 bytes
    root.chmod(0o755)  # munged wants its socket's folder executable by all
    for sub in ("state", "spool"):
        (root / sub).mkdir()
    for gpu in ("gpu0", "gpu1"):
        (root / gpu).touch()
    (root / "gres.conf").write_text(f"Name=gpu File={root}/gpu[0-1]\n")
    (root / "slurm.conf").write_text(SLURM_CONF.format(root=root, ctld_port=free_port(), slurmd_port=free_port()))
    monkeypatch.setenv("SLURM_CONF", str(root / "slurm.conf"))
    env = dict(os.environ)
    subprocess.run(["mungekey", "--create", "--keyfile", str(root / "munge.key")], check=True, timeout=30)
    procs = []
    try:
        munge = [f"--key-file={root}/munge.key", f"--socket={root}/munge.sock", f"--pid-file={root}/munged.pid",
                 f"--log-file={root}/munged.log", f"--seed-file={root}/munged.seed"]  # fmt: skip
        procs.append(start(["munged", "--foreground", "--force", *munge], root / "munged.out", env))
        deadline = time.monotonic() + 30
        while not (root / "munge.sock").exists():
            assert procs[0].poll() is None and time.monotonic() < deadline, (root / "munged.out").read_text()
            time.sleep(0.1)
        procs.append(start(["slurmctld", "-D", "-i"], root / "slurmctld.out", env))
        procs.append(start(["slurmd", "-D", "-N", "localhost"], root / "slurmd.out", env))
        deadline = time.monotonic() + 60
        state = ""
        while state != "idle":
            for proc, name in zip(procs, ("munged", "slurmctld", "slurmd"), strict=True):
                assert proc.poll() is None, f"{name} exited: {(root / f'{name}.out').read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"the node is {state!r}, not idle, after 60 s"
            time.sleep(0.5)
            sinfo = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, timeout=30)
            state = sinfo.stdout.strip()
        yield root
    finally:
        if len(procs) == 3 and procs[1].poll() is None:
            jobs = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=30)
            if ids := jobs.stdout.split():
                subprocess.run(["scancel", *ids], timeout=30)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and slurm_cli(["squeue", "-h", "-o", "%i"]).strip():
                    time.sleep(0.5)
        for proc in reversed(procs):
            stop(proc)
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_runs_trained_by_slurm_worker_jobs_from_a_scheduler_file_equal_local_runs(tmp_path, slurm):
    slurm_cluster = pytest.importorskip("dask_jobqueue").SLURMCluster
    from distributed import Client

    data = corpus(tmp_path / "corpus")
    cfgs = [config(seed=s, steps=60) for s in (1, 2)]  # a checkpoint every 20 steps
    local = [files(tmp_path / "local", c) for c in cfgs]
    train_runs(local, data, Pool(2, 1, ("cpu",)), log=lambda line: None)

    scheduler_file = tmp_path / "scheduler.json"
    cluster = slurm_cluster(
        queue="debug",
        cores=1,
        processes=1,
        memory="1GiB",
        walltime="00:15:00",
        job_extra_directives=["--gres=gpu:1"],
        worker_extra_args=["--resources", "GPU=1"],
        job_script_prologue=[f"cd {REPO}", f"export PYTHONPATH={REPO}"],  # the shared workspace
        log_directory=str(tmp_path / "worker-logs"),
        scheduler_options={"host": "127.0.0.1", "dashboard_address": None, "scheduler_file": str(scheduler_file)},
    )
    try:
        cluster.scale(jobs=2)
        with Client(cluster, set_as_default=False) as client:
            client.wait_for_workers(2, timeout=120)
            declared = [info["resources"] for info in client.scheduler_info()["workers"].values()]
        written = json.loads(scheduler_file.read_text())["address"]
        queue = slurm_cli(["squeue", "-h", "-o", "%j %T %b"]).splitlines()
        remote = [files(tmp_path / "cluster", c) for c in cfgs]
        lines = []
        pool = Pool(2, 1, ("cpu",), compute_params(cluster=str(scheduler_file)), {"GPU": 1.0})  # a whole GPU per run
        summaries = train_runs(remote, data, pool, log=lines.append)
    finally:
        cluster.close()
    assert declared == [{"GPU": 1.0}, {"GPU": 1.0}]
    assert sorted(queue) == ["dask-worker RUNNING gres:gpu:1"] * 2, queue
    assert written == cluster.scheduler_address
    assert f"on the Dask cluster at scheduler file {scheduler_file}" in lines[0], lines[0]
    assert all(s["status"] == "complete" for s in summaries.values()), summaries
    for a, b in zip(local, remote, strict=True):
        assert checkpoints(b.run_dir) == checkpoints(a.run_dir) and len(checkpoints(a.run_dir)) == 4


def doc_job_script() -> str:
    """The job script docs/scaling.md shows under "SLURM with dask-jobqueue" (its ```bash block)."""
    text = (REPO / "docs" / "scaling.md").read_text()
    section = text.split("### SLURM with dask-jobqueue", 1)[1].split("\n### ", 1)[0]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


def test_the_job_script_of_the_documented_slurm_cluster_is_the_one_docs_show():
    dask_jobqueue = pytest.importorskip("dask_jobqueue")
    with dask_jobqueue.SLURMCluster(  # the arguments of docs/scaling.md's start_cluster.py
        queue="gpu",
        cores=4,
        processes=1,
        memory="32GiB",
        walltime="04:00:00",
        job_extra_directives=["--gres=gpu:1"],
        worker_extra_args=["--resources", "GPU=1"],
        job_script_prologue=["cd /shared/me/topometrics", "source .venv/bin/activate"],
        scheduler_options={"host": "127.0.0.1", "dashboard_address": None},  # here only: nothing listens outside
    ) as cluster:
        script = cluster.job_script()
        address = cluster.scheduler_address
    shown = (
        doc_job_script()
        .replace("tcp://10.0.0.5:36789", address)
        .replace("/shared/me/topometrics/.venv/bin/python", sys.executable)
    )
    assert script.strip() == shown.strip()
    for line in ("#SBATCH -p gpu", "#SBATCH --cpus-per-task=4", "#SBATCH --mem=", "#SBATCH -t 04:00:00",
                 "#SBATCH --gres=gpu:1", "cd /shared/me/topometrics"):  # fmt: skip
        assert line in script
    worker = script.strip().splitlines()[-1]
    assert "-m distributed.cli.dask_worker " + address in worker and "--nthreads 4" in worker
    assert worker.endswith("--resources GPU=1")
