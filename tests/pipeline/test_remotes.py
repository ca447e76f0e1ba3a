"""DVC remotes a team shares (docs/sharing.md): an SSH remote on Debian's own `sshd` and an S3 remote on moto's S3
emulator, both on loopback; an experiment pushed from one clone and pulled, shown and applied in another; a push cut
by the SSH server stopping, then completed; and what DVC prints for the usual remote mistakes."""

import contextlib
import csv
import getpass
import hashlib
import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.pipeline.helpers import commit, dvc_env, failing, run, snapshot

pytestmark = pytest.mark.slow
SSHD = Path("/usr/sbin/sshd")
BUCKET = "topometrics-team"
S3_KEY = {"access_key_id": "emulator-key", "secret_access_key": "emulator-secret"}  # moto accepts any pair

SSHD_CONFIG = """\
Port {port}
ListenAddress 127.0.0.1
HostKey {root}/host_key
PidFile none
AuthorizedKeysFile {root}/authorized_keys
AllowUsers {user}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
# the keys sit under /tmp, a world-writable folder that StrictModes' ownership check refuses
StrictModes no
Subsystem sftp internal-sftp
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_key(path: Path) -> str:
    """A fresh ed25519 private key at ``path`` (mode 0600, as sshd wants host keys); returns its public line."""
    import asyncssh

    key = asyncssh.generate_private_key("ssh-ed25519")
    key.write_private_key(str(path))
    path.chmod(0o600)
    return key.export_public_key().decode()


class SSHServer:
    """Debian's sshd on a free loopback port, its host key, config and authorised keys in ``root``.

    ``keys``: alice and bob are authorised (two teammates), stranger is not.
    """

    def __init__(self, root: Path):
        root.mkdir()
        self.root, self.port, self.user = root, free_port(), getpass.getuser()
        self.keys = {name: root / name for name in ("alice", "bob", "stranger")}
        public = {name: write_key(path) for name, path in self.keys.items()}
        (root / "authorized_keys").write_text(public["alice"] + public["bob"])
        write_key(root / "host_key")
        (root / "sshd_config").write_text(SSHD_CONFIG.format(port=self.port, root=root, user=self.user))
        self.proc: subprocess.Popen | None = None

    def url(self, path: Path) -> str:
        return f"ssh://127.0.0.1:{self.port}{path}"

    def start(self) -> None:
        """Start sshd (again on the same port after ``stop``) and wait until it listens."""
        log = self.root / "sshd.log"
        start = log.stat().st_size if log.exists() else 0  # a restart appends to the same log
        with log.open("ab") as out:
            self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", self.root / "sshd_config"], stdout=out, stderr=out)
        deadline = time.monotonic() + 10
        while f"Server listening on 127.0.0.1 port {self.port}.".encode() not in log.read_bytes()[start:]:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"sshd did not start:\n{log.read_text()}")
            time.sleep(0.02)

    def stop(self) -> None:
        """SIGKILL the sshd we started and the per-connection sshd processes it forked: those call setsid(), so a
        signal to the listener alone would leave an open transfer running to its end."""
        if self.proc is None or self.proc.poll() is not None:
            return
        forked = psutil.Process(self.proc.pid).children(recursive=True)
        self.proc.kill()
        self.proc.wait()
        for child in forked:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()


@pytest.fixture
def sshd(tmp_path):
    if not SSHD.exists():
        pytest.skip("/usr/sbin/sshd is absent: install Debian's openssh-server (the README's test command does)")
    if os.geteuid() == 0 and not Path("/run/sshd").is_dir():
        # sshd started as root refuses to run without its privilege-separation folder, which Debian's service
        # unit creates at boot (RuntimeDirectory=sshd); a container that never started the service lacks it
        Path("/run/sshd").mkdir(mode=0o755)
    server = SSHServer(tmp_path / "sshd")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3(monkeypatch, tmp_path):
    """moto's S3 emulator on a free loopback port with one bucket; returns its endpoint URL. No AWS variable or file
    of this machine reaches the dvc commands, and no credential lookup leaves loopback (EC2 metadata is off)."""
    import boto3
    from moto.server import ThreadedMotoServer

    for name in [name for name in os.environ if name.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    endpoint = "http://{}:{}".format(*server.get_host_and_port())
    keys = {"aws_access_key_id": S3_KEY["access_key_id"], "aws_secret_access_key": S3_KEY["secret_access_key"]}
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **keys).create_bucket(Bucket=BUCKET)
    yield endpoint
    server.stop()


def add_ssh_remote(project: Path, server: SSHServer, path: Path, key: str = "alice") -> None:
    """The documented setup: the URL in .dvc/config (committed), the login in .dvc/config.local (never committed)."""
    run(["dvc", "remote", "add", "-d", "shared", server.url(path)], project)
    ssh_login(project, server, key)


def ssh_login(project: Path, server: SSHServer, key: str) -> None:
    run(["dvc", "remote", "modify", "--local", "shared", "user", server.user], project)
    run(["dvc", "remote", "modify", "--local", "shared", "keyfile", str(server.keys[key])], project)


def add_s3_remote(project: Path, endpoint: str) -> None:
    run(["dvc", "remote", "add", "-d", "shared", f"s3://{BUCKET}/topometrics"], project)
    run(["dvc", "remote", "modify", "shared", "endpointurl", endpoint], project)  # an address, not a secret
    s3_login(project)


def s3_login(project: Path) -> None:
    for option, value in S3_KEY.items():
        run(["dvc", "remote", "modify", "--local", "shared", option, value], project)


def commit_remote(project: Path) -> None:
    """Commit .dvc/config; its credentials stay out of git."""
    config = (project / ".dvc/config").read_text()
    assert "keyfile" not in config and "secret_access_key" not in config, config
    run(["git", "check-ignore", "-q", ".dvc/config.local"], project)  # DVC's .dvc/.gitignore lists it
    run(["git", "add", ".dvc/config"], project)
    run(["git", "commit", "-qm", "shared remote"], project)


def clone(project: Path, to: Path) -> Path:
    run(["git", "clone", "-q", str(project), str(to)], project.parent)
    return to


def always_changed(project: Path) -> set[str]:
    """Stages that re-check on every `dvc repro` (corpus and series look for the network again)."""
    stages = yaml.safe_load((project / "dvc.yaml").read_text())["stages"]
    return {name for name, stage in stages.items() if stage.get("always_changed")}


def assert_up_to_date(project: Path) -> None:
    """`dvc status` reports only the always-changed stages, and `dvc repro` reruns no other stage."""
    status = run(["dvc", "status"], project)
    states = [line.strip() for line in status.splitlines() if line.startswith("\t")]
    stages = {line.rstrip(":") for line in status.splitlines() if line and not line.startswith("\t")}
    assert set(states) == {"always changed"} and stages == always_changed(project), status
    out = run(["dvc", "repro"], project)
    assert set(re.findall(r"Running stage '([^']+)'", out)) <= always_changed(project), out
    assert "Stage 'train' didn't change, skipping" in out and "Stage 'warehouse' didn't change, skipping" in out


def cache_objects(root: Path) -> set[str]:
    """Content hashes held under a DVC cache or remote folder (``files/md5/ab/cdef…``), partial uploads left out."""
    return {p.parent.name + p.name for p in (root / "files/md5").glob("*/*") if not p.name.endswith(".tmp")}


def assert_cache_verifies(project: Path) -> None:
    """Every object in the clone's cache hashes to its name (DVC names objects by MD5; a .dir object is its listing)."""
    objects = sorted(p for p in (project / ".dvc/cache/files/md5").glob("*/*"))
    assert objects
    for path in objects:
        assert hashlib.md5(path.read_bytes()).hexdigest() == (path.parent.name + path.name).removesuffix(".dir"), path


def test_ssh_remote_round_trip_through_debian_sshd(reproduced, sshd, tmp_path):
    add_ssh_remote(reproduced, sshd, tmp_path / "remote")
    commit_remote(reproduced)
    assert re.search(r"^\d+ files pushed$", run(["dvc", "push"], reproduced), re.M)
    other = clone(reproduced, tmp_path / "other")
    ssh_login(other, sshd, "bob")  # a teammate: own login, same committed URL
    run(["dvc", "pull"], other)
    assert_cache_verifies(other)
    assert_up_to_date(other)
    assert (other / "data/warehouse.duckdb").read_bytes() == (reproduced / "data/warehouse.duckdb").read_bytes()


def test_s3_remote_round_trip_through_an_emulator_at_endpointurl(reproduced, s3, tmp_path):
    add_s3_remote(reproduced, s3)
    commit_remote(reproduced)
    assert re.search(r"^\d+ files pushed$", run(["dvc", "push"], reproduced), re.M)
    other = clone(reproduced, tmp_path / "other")
    assert "endpointurl = " + s3 in (other / ".dvc/config").read_text()
    s3_login(other)
    run(["dvc", "pull"], other)
    assert_cache_verifies(other)
    assert_up_to_date(other)
    assert (other / "data/warehouse.duckdb").read_bytes() == (reproduced / "data/warehouse.duckdb").read_bytes()


def test_an_experiment_pushed_from_one_clone_is_pulled_shown_and_applied_in_another(reproduced, s3, tmp_path):
    origin = tmp_path / "origin.git"  # the team's git server
    run(["git", "init", "-q", "--bare", str(origin)], tmp_path)
    add_s3_remote(reproduced, s3)
    commit_remote(reproduced)
    run(["git", "remote", "add", "origin", str(origin)], reproduced)
    run(["git", "push", "-q", "origin", "HEAD"], reproduced)
    baseline = json.loads((reproduced / "reports/train/a-42.json").read_text())
    baseline_headline = json.loads((reproduced / "reports/metrics.json").read_text())["final_val_loss"]["a"]

    out = run(["dvc", "exp", "run", "-n", "hidden16", "-S", "train.hidden=16"], reproduced)
    assert "Running stage 'train'" in out and "Ran experiment(s): hidden16" in out
    trained = json.loads((reproduced / "reports/train/a-42.json").read_text())
    assert trained["n_params"] > baseline["n_params"]
    headline = json.loads((reproduced / "reports/metrics.json").read_text())["final_val_loss"]["a"]  # the metric
    out = run(["dvc", "exp", "push", "origin", "hidden16"], reproduced)
    assert "Pushed experiment hidden16 to Git remote 'origin'" in out

    other = clone(origin, tmp_path / "other")
    s3_login(other)
    assert "hidden16" in run(["dvc", "exp", "list", "origin"], other)
    run(["dvc", "exp", "pull", "origin", "hidden16"], other)
    shown = csv.DictReader(run(["dvc", "exp", "show", "--csv"], other).splitlines())
    rows = {row["Experiment"] or row["rev"]: row for row in shown}
    assert rows["hidden16"]["train.hidden"] == "16"
    assert float(rows["hidden16"]["final_val_loss.a"]) == pytest.approx(headline, rel=1e-9)
    diff = json.loads(run(["dvc", "metrics", "diff", "HEAD", "hidden16", "--json"], other))
    loss = diff["reports/metrics.json"]["final_val_loss.a"]
    assert loss["new"] == pytest.approx(headline) and loss["old"] == pytest.approx(baseline_headline)

    assert not (other / "data/runs").exists()  # nothing pulled but the experiment
    run(["dvc", "exp", "apply", "hidden16"], other)
    run(["dvc", "checkout"], other)
    for folder in ("data/runs", "data/features", "reports"):  # checkpoints, feature shards, metrics
        assert snapshot(other / folder) == snapshot(reproduced / folder), folder
    assert (other / "data/warehouse.duckdb").read_bytes() == (reproduced / "data/warehouse.duckdb").read_bytes()


def test_a_push_cut_by_the_ssh_server_stopping_completes_when_pushed_again(reproduced, sshd, tmp_path):
    blobs = reproduced / "data/blobs"  # 64 MiB in 128 files: a push long enough to cut
    blobs.mkdir()
    for i in range(128):
        (blobs / f"{i:03d}.bin").write_bytes(os.urandom(512 << 10))
    run(["dvc", "add", "data/blobs"], reproduced)
    commit(reproduced, "blobs")
    remote = tmp_path / "remote"
    add_ssh_remote(reproduced, sshd, remote)
    commit_remote(reproduced)
    local = cache_objects(reproduced / ".dvc/cache")
    before = snapshot(reproduced)

    push = subprocess.Popen(["dvc", "push"], cwd=reproduced, env=dvc_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (remote / "files/md5").is_dir() or not cache_objects(remote):
            assert push.poll() is None and time.monotonic() < deadline, "the push ended before its first upload"
            time.sleep(0.005)
        sshd.stop()
        out = push.communicate(timeout=120)[0]
    finally:
        push.kill()  # a no-op once it has ended
    assert push.returncode != 0 and "Connection not open" in out, out  # per file, then in a summary line
    assert 0 < len(cache_objects(remote)) < len(local), "the stop came too late"

    sshd.start()  # same port, same host key
    out = run(["dvc", "push"], reproduced)
    assert re.search(r"^\d+ files pushed$", out, re.M), out
    assert cache_objects(remote) <= local
    assert "Cache and remote 'shared' are in sync." in run(["dvc", "status", "--cloud"], reproduced)
    after = snapshot(reproduced)
    assert {k: v for k, v in after.items() if not k.startswith(".dvc/tmp/")} == {
        k: v for k, v in before.items() if not k.startswith(".dvc/tmp/")
    }  # DVC's own index and locks aside, no cache object and no workspace file changed

    other = clone(reproduced, tmp_path / "other")
    ssh_login(other, sshd, "bob")
    run(["dvc", "remote", "modify", "--local", "shared", "verify", "true"], other)  # DVC re-hashes what it pulls
    run(["dvc", "pull"], other)
    assert_cache_verifies(other)
    assert snapshot(other / "data/blobs") == snapshot(blobs)


@pytest.fixture
def tiny_repo(tmp_path) -> Path:
    """A git+DVC repository with one tracked file: enough for `dvc push` to reach a remote."""
    root = tmp_path / "tiny"
    root.mkdir()
    run(["git", "init", "-q"], root)
    run(["dvc", "init", "-q"], root)
    (root / "data.txt").write_text("one tracked file\n")
    run(["dvc", "add", "-q", "data.txt"], root)
    return root


def test_remote_url_typos_are_caught_or_visible_in_dvc_remote_list(tiny_repo):
    out = failing(["dvc", "remote", "add", "-d", "shared", "shh://127.0.0.1/srv/dvc"], tiny_repo)
    assert "ERROR: configuration error - config file error: Unsupported URL type shh://" in out
    # one slash is no scheme: DVC takes it for a folder inside the repository, and a push fills that silently
    run(["dvc", "remote", "add", "-d", "shared", f"s3:/{BUCKET}/topometrics"], tiny_repo)
    assert run(["dvc", "config", "remote.shared.url"], tiny_repo) == f"{tiny_repo}/s3:/{BUCKET}/topometrics\n"
    assert "1 file pushed" in run(["dvc", "push"], tiny_repo)
    assert len(cache_objects(tiny_repo / f"s3:/{BUCKET}/topometrics")) == 1


def test_ssh_mistakes_fail_with_what_docs_sharing_md_lists(tiny_repo, sshd, tmp_path, monkeypatch):
    add_ssh_remote(tiny_repo, sshd, tmp_path / "remote")

    def push_fails(option: str, value: str) -> str:
        run(["dvc", "remote", "modify", "--local", "shared", option, value], tiny_repo)
        return failing(["dvc", "push"], tiny_repo)

    out = push_fails("keyfile", str(sshd.keys["stranger"]))
    assert f"ERROR: unexpected error - Permission denied for user {sshd.user} on host 127.0.0.1" in out
    out = push_fails("keyfile", str(tmp_path / "no_such_key"))
    assert f"ERROR: unexpected error - [Errno 2] No such file or directory: '{tmp_path / 'no_such_key'}'" in out
    run(["dvc", "remote", "modify", "--local", "shared", "keyfile", str(sshd.keys["alice"])], tiny_repo)
    out = push_fails("user", "no-such-user")
    assert "ERROR: unexpected error - Permission denied for user no-such-user on host 127.0.0.1" in out
    run(["dvc", "remote", "modify", "--local", "shared", "user", sshd.user], tiny_repo)
    port = free_port()  # a wrong host or port: nothing listens there
    run(["dvc", "remote", "modify", "shared", "url", f"ssh://127.0.0.1:{port}{tmp_path / 'remote'}"], tiny_repo)
    assert f"ERROR: unexpected error - [Errno 111] Connect call failed ('127.0.0.1', {port})" in failing(
        ["dvc", "push"], tiny_repo
    )

    # DVC's SSH client (sshfs) does not consult known_hosts: a host key other than the server's does not stop it
    run(["dvc", "remote", "modify", "shared", "url", sshd.url(tmp_path / "remote")], tiny_repo)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    other_key = write_key(tmp_path / "other_host_key").split()[:2]
    (home / ".ssh/known_hosts").write_text(f"[127.0.0.1]:{sshd.port} {' '.join(other_key)}\n")
    monkeypatch.setenv("HOME", str(home))
    assert "1 file pushed" in run(["dvc", "push"], tiny_repo)


def test_s3_mistakes_fail_with_what_docs_sharing_md_lists(tiny_repo, s3):
    run(["dvc", "remote", "add", "-d", "shared", f"s3://{BUCKET}/topometrics"], tiny_repo)
    run(["dvc", "remote", "modify", "shared", "endpointurl", s3], tiny_repo)
    assert "ERROR: unexpected error - Unable to locate credentials" in failing(["dvc", "push"], tiny_repo)
    s3_login(tiny_repo)
    run(["dvc", "remote", "modify", "shared", "url", "s3://no-such-bucket/topometrics"], tiny_repo)
    out = failing(["dvc", "push"], tiny_repo)
    assert "The specified bucket does not exist" in out and "NoSuchBucket" in out  # per object or in a listing
    run(["dvc", "remote", "modify", "shared", "url", f"s3://{BUCKET}/topometrics"], tiny_repo)
    endpoint = f"http://127.0.0.1:{free_port()}"  # a wrong endpoint: nothing listens there
    run(["dvc", "remote", "modify", "shared", "endpointurl", endpoint], tiny_repo)
    assert f'ERROR: unexpected error - Could not connect to the endpoint URL: "{endpoint}/' in failing(
        ["dvc", "push"], tiny_repo
    )


def test_a_fresh_clone_that_pulls_reproduces_nothing_that_changes_a_tracked_output(reproduced, tmp_path):
    """`dvc pull` + `dvc repro` in a fresh clone: the always-changed series stage reuses the pulled shards and writes
    the same status.json (a current shard is 'computed' there too), so no later stage reruns, dvc.lock stays as
    committed and the warehouse is byte-identical to the pusher's. The series is the project's own run folder (its
    resume state is a skip)."""
    params = yaml.safe_load((reproduced / "params.yaml").read_text())
    params["series"]["sources"] = {"own": {"path": "data/runs/a-42", "seed": 42}}
    (reproduced / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    assert "series own: 5 computed, 0 reused, 1 skipped" in run(["dvc", "repro"], reproduced)
    run(["dvc", "remote", "add", "-d", "shared", str(tmp_path / "remote")], reproduced)
    commit(reproduced, "a series and a shared remote")
    run(["dvc", "push"], reproduced)
    other = clone(reproduced, tmp_path / "other")
    run(["dvc", "pull"], other)
    out = run(["dvc", "repro"], other)
    assert "series own: 0 computed, 5 reused, 1 skipped" in out
    assert set(re.findall(r"Running stage '([^']+)'", out)) <= always_changed(other), out
    assert run(["git", "status", "--porcelain"], other) == ""  # dvc.lock (and every tracked file) as committed
    for path in ("data/warehouse.duckdb", "data/series/status.json", "reports/report.html"):
        assert (other / path).read_bytes() == (reproduced / path).read_bytes(), path


MAKE_STAGE = {
    "stages": {
        "make": {
            "cmd": "python -c \"import yaml; x = yaml.safe_load(open('params.yaml'))['x']; "
            "open('out.txt', 'w').write(str(x) * 1000)\"",
            "params": ["x"],
            "outs": ["out.txt"],
        }
    }
}


def test_an_experiment_run_before_the_remote_was_committed_travels_when_each_clone_names_the_remote_locally(
    tmp_path,
):
    """docs/sharing.md, "An experiment older than the remote": DVC reads the remote from the experiment's own
    commit, so an experiment run before `dvc remote add` was committed is pushed without its outputs (the pinned
    DVC says "Pushed experiment" and uploads nothing), and `dvc exp push -r` fails; the remote named in each
    clone's `.dvc/config.local` carries it, and `dvc exp apply` cannot take that one away."""
    origin, store = tmp_path / "origin.git", tmp_path / "store"
    run(["git", "init", "-q", "--bare", str(origin)], tmp_path)
    alice = tmp_path / "alice"
    alice.mkdir()
    run(["git", "init", "-q"], alice)
    run(["dvc", "init", "-q"], alice)
    (alice / "params.yaml").write_text("x: 1\n")
    (alice / "dvc.yaml").write_text(yaml.safe_dump(MAKE_STAGE))
    run(["dvc", "repro", "-q"], alice)
    commit(alice, "base")
    run(["git", "remote", "add", "origin", str(origin)], alice)
    run(["git", "push", "-q", "origin", "HEAD"], alice)
    run(["dvc", "exp", "run", "-q", "-n", "x2", "-S", "x=2"], alice)  # before any remote
    run(["dvc", "remote", "add", "-d", "shared", str(store)], alice)
    commit(alice, "the shared remote")
    run(["git", "push", "-q", "origin", "HEAD"], alice)

    assert "Pushed experiment x2" in run(["dvc", "exp", "push", "origin", "x2"], alice)
    assert not store.exists()  # the trap: the experiment's commit names no remote, so no output went
    run(["dvc", "remote", "add", "--local", "shared", str(store)], alice)
    assert "1 file uploaded" in run(["dvc", "exp", "push", "-f", "-r", "shared", "origin", "x2"], alice)

    bob = clone(origin, tmp_path / "bob")
    run(["dvc", "remote", "add", "--local", "shared", str(store)], bob)
    run(["dvc", "exp", "pull", "-r", "shared", "origin", "x2"], bob)
    run(["dvc", "exp", "apply", "x2"], bob)
    assert (bob / "out.txt").read_text() == "2" * 1000 and "shared" in (bob / ".dvc/config.local").read_text()
    run(["git", "checkout", "HEAD", "--", ".dvc/config"], bob)  # the committed remote back, as the docs say
    assert "shared" in (bob / ".dvc/config").read_text()
    assert "up to date" in run(["dvc", "status"], bob)
