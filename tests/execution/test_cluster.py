"""Connecting to Dask clusters (addresses, scheduler files, TLS with certificates made here) and
mapping jobs over them, with real faults: a worker killed with SIGKILL, a worker out of memory.
Every cluster is a LocalCluster on 127.0.0.1."""

import datetime
import json
import os
import signal
import socket
import ssl
import time

import dask
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from distributed import Client, LocalCluster
from distributed.security import Security

from tests.execution.helpers import worker_pids
from tests.repo_params import raw_params
from topometrics.execution.cluster import (
    CheckpointJobError,
    ClusterError,
    connect,
    local_cluster,
    map_on_cluster,
    security,
)
from topometrics.params import ParamsError, parse_params
from topometrics.params_sources import ComputeParams, SecurityParams


def free_port() -> int:  # not run_helpers': workers import this module, and run_helpers' imports (torch) would
    # fill the 300 MiB an out-of-memory test gives a worker before its job starts
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def square(x):
    return x * x


def fail_on_three(x):
    if x == 3:
        raise ValueError(f"job {x} is bad")
    return x


def slow_identity(x):
    time.sleep(0.4)
    return x


def allocate_mib(mib):
    import numpy as np

    block = np.ones(mib * 2**20, dtype=np.uint8)  # touched pages: resident memory
    time.sleep(1.5)  # hold it past the nanny's memory check (every 100 ms)
    return int(block[-1])


# ---------------------------------------------------------------------------
# Addresses and scheduler files
# ---------------------------------------------------------------------------


def test_unreachable_scheduler_is_one_line_naming_the_address():
    address = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    start = time.monotonic()
    with pytest.raises(ClusterError) as err, connect(address, timeout_s=1):
        pytest.fail("connected to a closed port")
    assert time.monotonic() - start < 10
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"cannot reach the Dask scheduler at {address} within 1 s")
    assert "compute.cluster: local" in message


def test_a_plain_tcp_scheduler_off_this_machine_is_warned_as_unauthenticated_and_loopback_is_not(capsys):
    """Plain tcp:// to another host (192.0.2.1, TEST-NET: nothing answers) prints one warning line naming the address
    and the tls:// fix before connecting; 127.0.0.1, ::1 and localhost stay on this machine and are not warned."""
    address = "tcp://192.0.2.1:8786"
    with pytest.raises(ClusterError), connect(address, timeout_s=1):
        pytest.fail("connected to TEST-NET")
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"warning: compute.cluster {address} is plain TCP: unauthenticated and unencrypted")
    assert line.endswith("use tls:// with compute.security (docs/scaling.md)")
    for host in ("127.0.0.1", "[::1]", "localhost"):
        with pytest.raises(ClusterError), connect(f"tcp://{host}:{free_port()}", timeout_s=1):
            pytest.fail("connected to a closed port")
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("cluster", "tls", "expected"),
    [
        ("tls://127.0.0.1:8786", None, "tls://127.0.0.1:8786 is a TLS address: set compute.security"),
        (
            "tcp://127.0.0.1:8786",
            SecurityParams(__file__, __file__),
            "compute.security is set but tcp://127.0.0.1:8786",
        ),
        ("http://host:8786", None, "'http://host:8786' is not tcp://host:port"),
        ("/nonexistent/scheduler.json", None, "scheduler file /nonexistent/scheduler.json not found"),
        ("local", None, "compute.cluster is 'local'"),
    ],
)
def test_bad_cluster_settings_fail_before_connecting(cluster, tls, expected):
    with pytest.raises(ClusterError, match=expected), connect(cluster, tls, timeout_s=1):
        pytest.fail("connected")


def test_missing_tls_file_names_the_key(tmp_path):
    with pytest.raises(ClusterError, match=r"compute.security.ca: .*nope.pem is not a file; name the PEM file"):
        security(SecurityParams(str(tmp_path / "nope.pem"), __file__))


def test_compute_params_parse_security_paths():
    raw, timeout = raw_params(), raw_params()["compute"]["connect_timeout_s"]
    tls = {"cluster": "tls://10.0.0.5:8786", "connect_timeout_s": timeout}
    compute = parse_params(raw | {"compute": tls | {"security": {"ca": "ca.pem", "cert": "c.pem"}}}).compute
    expected = ComputeParams(
        cluster="tls://10.0.0.5:8786", security=SecurityParams("ca.pem", "c.pem"), connect_timeout_s=timeout
    )
    assert compute == expected
    assert parse_params(raw).compute.security is None
    with pytest.raises(ParamsError, match="compute.security needs ca and cert"):
        parse_params(raw | {"compute": tls | {"security": {"ca": "ca.pem"}}})
    with pytest.raises(ParamsError, match="unknown param compute.security.password"):
        parse_params(raw | {"compute": tls | {"security": {"ca": "a", "cert": "b", "password": "x"}}})


def test_scheduler_file_connects_and_runs_jobs(tmp_path):
    path = tmp_path / "scheduler.json"
    with LocalCluster(
        n_workers=1, processes=False, dashboard_address=None, scheduler_kwargs={"scheduler_file": str(path)}
    ):
        assert json.loads(path.read_text())["address"]
        with connect(str(path), timeout_s=5) as client:
            assert sorted(map_on_cluster(client, square, [1, 2, 3])) == [(0, 1), (1, 4), (2, 9)]


def test_scheduler_without_workers_is_an_error():
    with LocalCluster(
        n_workers=0, processes=False, protocol="tcp://", host="127.0.0.1", dashboard_address=None
    ) as cluster:
        expected = f"at {cluster.scheduler_address} has no workers after 1 s"
        with pytest.raises(ClusterError, match=expected), connect(cluster.scheduler_address, timeout_s=1):
            pytest.fail("connected")


# ---------------------------------------------------------------------------
# TLS with a CA and certificates made here
# ---------------------------------------------------------------------------


def make_ca(name: str):
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    return key, cert


def issue(ca, name: str, folder) -> tuple[str, str]:
    """A certificate for ``name`` signed by ``ca``: (cert file, key file)."""
    ca_key, ca_cert = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    cert_file, key_file = folder / f"{name}.crt", folder / f"{name}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(cert_file), str(key_file)


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    """A TLS LocalCluster (scheduler and worker certificates from our CA) and the files of a client."""
    folder = tmp_path_factory.mktemp("tls")
    ca = make_ca("topometrics test CA")
    ca_file = folder / "ca.crt"
    ca_file.write_bytes(ca[1].public_bytes(serialization.Encoding.PEM))
    scheduler, worker, client = issue(ca, "scheduler", folder), issue(ca, "worker", folder), issue(ca, "client", folder)
    server = Security(
        tls_ca_file=str(ca_file), tls_scheduler_cert=scheduler[0], tls_scheduler_key=scheduler[1],
        tls_worker_cert=worker[0], tls_worker_key=worker[1], tls_client_cert=client[0], tls_client_key=client[1],
        require_encryption=True,
    )  # fmt: skip
    other_ca = make_ca("someone else's CA")
    other_ca_file = folder / "other-ca.crt"
    other_ca_file.write_bytes(other_ca[1].public_bytes(serialization.Encoding.PEM))
    stranger = issue(other_ca, "stranger", folder)
    with LocalCluster(n_workers=1, processes=False, protocol="tls://", host="127.0.0.1", security=server,
                      dashboard_address=None) as cluster:  # fmt: skip
        yield (
            cluster.scheduler_address,
            SecurityParams(str(ca_file), *client),
            SecurityParams(str(other_ca_file), *stranger),
        )


def test_tls_client_with_the_certificate_runs_jobs(tls_cluster):
    address, files, _ = tls_cluster
    assert address.startswith("tls://127.0.0.1:")
    with connect(address, files, timeout_s=5) as client:
        assert dict(map_on_cluster(client, square, [5, 6])) == {0: 25, 1: 36}


def test_tls_client_with_a_foreign_certificate_is_refused(tls_cluster):
    address, _, stranger = tls_cluster
    expected = f"cannot reach the Dask scheduler at {address} .*(SSL|certificate)"
    with pytest.raises(ClusterError, match=expected), connect(address, stranger, timeout_s=2):
        pytest.fail("a certificate from another CA was accepted")


def test_tls_scheduler_refuses_a_client_without_a_certificate(tls_cluster):
    address, files, _ = tls_cluster
    host, port = address.removeprefix("tls://").rsplit(":", 1)
    # A TLS client that trusts our CA (so it accepts the scheduler) but shows no certificate.
    context = ssl.create_default_context(cafile=files.ca)
    context.check_hostname = False
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        context.wrap_socket(raw) as conn,
        pytest.raises(ssl.SSLError, match="CERTIFICATE_REQUIRED"),
    ):
        conn.do_handshake()
        conn.recv(1)  # TLS 1.3: the server's refusal arrives after the client's handshake ends
    # Plain tcp:// to the TLS port: never gets a scheduler.
    plain = address.replace("tls://", "tcp://")
    with pytest.raises(ClusterError, match=f"{plain} answers but is not a Dask scheduler"), connect(plain, timeout_s=1):
        pytest.fail("plain tcp was accepted")


# ---------------------------------------------------------------------------
# Mapping jobs, and faults
# ---------------------------------------------------------------------------


def test_a_failing_job_is_named_and_the_others_complete():
    with LocalCluster(n_workers=2, processes=False, dashboard_address=None) as cluster, Client(cluster) as client:
        results = dict(map_on_cluster(client, fail_on_three, [1, 2, 3, 4]))
    assert {i: r for i, r in results.items() if i != 2} == {0: 1, 1: 2, 3: 4}
    assert isinstance(results[2], ValueError) and str(results[2]) == "job 3 is bad"  # the job's own exception


def test_a_worker_killed_mid_task_loses_nothing():
    with local_cluster(2, memory_limit=None) as cluster, Client(cluster) as client:
        pids = worker_pids(client)
        results = map_on_cluster(client, slow_identity, list(range(8)))
        got = [next(results)]
        processing = {w: tasks for w, tasks in client.processing().items() if tasks}
        victim = next(iter(processing))
        os.kill(pids[victim], signal.SIGKILL)
        got += list(results)
    indices = [i for i, _ in got]
    assert sorted(indices) == list(range(8))  # no job lost, none twice
    assert all(i == r for i, r in got)


def test_a_worker_out_of_memory_fails_that_job_only():
    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 1}),
        local_cluster(2, memory_limit="300MiB") as cluster,
        Client(cluster) as client,
    ):
        results = dict(map_on_cluster(client, allocate_mib, [1, 600, 2]))
    assert results[0] == 1 and results[2] == 1
    assert isinstance(results[1], CheckpointJobError)
    assert results[1].kind == "WorkerOutOfMemory"
    assert "exceeded the worker memory limit (0.29 GiB) on 2 workers" in str(results[1])


def kill_own_worker(x):
    os.kill(os.getpid(), signal.SIGKILL)
    return x


def test_a_job_that_kills_its_workers_is_named_worker_lost():
    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 0}),
        local_cluster(1, memory_limit=None) as cluster,
        Client(cluster) as client,
    ):
        results = dict(map_on_cluster(client, kill_own_worker, [1]))  # alone: no other task shares its fate
    assert results[0].kind == "WorkerLost"
    assert str(results[0]).startswith("WorkerLost: 1 workers died running this job (last tcp://127.0.0.1:")
