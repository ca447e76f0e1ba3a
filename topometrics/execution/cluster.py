"""Dask distributed clusters: connecting to one, and mapping per-checkpoint jobs over it.

``compute.cluster`` names where per-checkpoint work runs (see ``docs/scaling.md``):

- ``local`` — this machine (the process pool of the execution seam; nothing here is used);
- ``tcp://host:8786`` / ``tls://host:8786`` — the address of a running Dask scheduler;
- a path to a scheduler file (JSON written by ``dask scheduler --scheduler-file``).

``compute.security`` names the TLS files (``ca``, ``cert``, ``key``) passed to Dask's
:class:`distributed.security.Security`; a ``tls://`` address needs them. Connecting fails before
any work starts, with a one-line :class:`ClusterError` naming the address; there is no silent fall
back to local execution.

A plain ``tcp://`` scheduler runs whatever a connected client sends it: it must only be reachable
from trusted hosts. The security files' *paths* may be in params.yaml; their contents never are,
and neither is anything else secret.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from topometrics.errors import TopometricsError
from topometrics.params_sources import SecurityParams

LOCAL = "local"
_ADDRESS = re.compile(r"^(tcp|tls)://[^/\s]+:\d+$")
_MAX_GREETING = 2**20  # bytes: a scheduler's first message (its handshake) is a few dozen


class ClusterError(TopometricsError, RuntimeError):
    """The Dask cluster cannot be used: unreachable, refused, misconfigured. One line, naming the address."""


class CheckpointJobError(RuntimeError):
    """Every worker that ran a job died; ``kind`` names why (``WorkerLost`` or ``WorkerOutOfMemory``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


def security(files: SecurityParams):
    """The :class:`distributed.security.Security` of a client of a TLS cluster (encryption required).

    Raises :class:`ClusterError` naming the ``compute.security`` key of a file that is not there.
    """
    from distributed.security import Security

    for name in ("ca", "cert", "key"):
        path = getattr(files, name)
        if path is not None and not Path(path).is_file():
            raise ClusterError(f"compute.security.{name}: {path} is not a file; name the PEM file")
    return Security(tls_ca_file=files.ca, tls_client_cert=files.cert, tls_client_key=files.key, require_encryption=True)


def describe(cluster: str) -> str:
    """How ``cluster`` is reached, for messages: the address, or ``scheduler file <path>``."""
    return cluster if _ADDRESS.match(cluster) else f"scheduler file {cluster}"


@contextmanager
def connect(cluster: str, tls: SecurityParams | None = None, timeout_s: float = 10.0):
    """A :class:`distributed.Client` of an existing cluster with at least one worker; closed on exit.

    Parameters
    ----------
    cluster : ``tcp://host:port``, ``tls://host:port`` or the path of a scheduler file
    tls : the TLS files; required for ``tls://`` (and refused for ``tcp://``: no silent downgrade)
    timeout_s : seconds to wait for the scheduler, and then for its first worker

    Raises
    ------
    ClusterError
        Unreachable, refused (e.g. TLS without the right certificate) or without workers: one line
        naming the address, raised before any work is submitted.
    """
    if cluster == LOCAL:
        raise ClusterError("compute.cluster is 'local': there is no cluster to connect to")
    from distributed import Client

    where = describe(cluster)
    kwargs = _client_kwargs(cluster, tls)
    if warning := unauthenticated_warning(cluster):
        print(warning, file=sys.stderr, flush=True)
    _check_answers_as_dask(kwargs, where, timeout_s)
    try:
        client = Client(timeout=timeout_s, set_as_default=False, **kwargs)
    except (OSError, TimeoutError, ValueError, TypeError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ClusterError(
            f"cannot reach the Dask scheduler at {where} within {timeout_s:g} s ({first}); "
            "check compute.cluster and compute.security, or set compute.cluster: local"
        ) from None
    try:
        try:
            client.wait_for_workers(1, timeout=timeout_s)
        except TimeoutError:
            raise ClusterError(
                f"the Dask scheduler at {where} has no workers after {timeout_s:g} s; start some (dask worker ...)"
            ) from None
        yield client
    finally:
        client.close()


def check_workers(client, cluster: str, visible: list[Path], resources: dict[str, float]) -> None:
    """Before any job: every worker sees each folder of ``visible`` (a filesystem shared with this machine),
    and some worker declares each resource of ``resources`` (``dask worker --resources GPU=1``).

    Raises :class:`ClusterError` naming the first worker and path it cannot see, or the missing resource:
    a job would otherwise fail on that worker, or wait for a worker that never comes.
    """
    where = describe(cluster)
    if visible:
        missing = client.run(_missing, [str(p) for p in visible])
        for worker, path in sorted(missing.items()):
            if path is not None:
                raise ClusterError(
                    f"the Dask worker {worker} of {where} cannot see {path}; run the workers on a filesystem "
                    "shared with this workspace (same path), or set compute.cluster: local"
                )
    declared = {name for info in client.scheduler_info()["workers"].values() for name in info.get("resources", {})}
    for name in sorted(set(resources) - declared):
        raise ClusterError(
            f"no worker of the Dask scheduler at {where} declares the {name} resource; start GPU workers with "
            f"`dask worker --resources {name}=1` or set train.device: cpu"
        )


def _missing(paths: list[str]) -> str | None:
    """On a worker: the first of ``paths`` that is not a folder it can list, or None."""
    import os

    return next((p for p in paths if not (os.path.isdir(p) and os.access(p, os.R_OK | os.X_OK))), None)


def _check_answers_as_dask(kwargs: dict, where: str, timeout_s: float) -> None:
    """A plain ``tcp://`` scheduler greets a new connection at once with a Dask frame (8 bytes: its small
    length); anything else there (an HTTP server waits for a request, another protocol sends text) would
    make the client hang or read text as a frame length. Raises :class:`ClusterError` naming the address.
    TLS addresses are left to the TLS handshake."""
    address = kwargs.get("address")
    if address is None and kwargs.get("scheduler_file"):
        try:
            address = json.loads(Path(kwargs["scheduler_file"]).read_text()).get("address")
        except (OSError, ValueError, AttributeError):
            why = "is not a Dask scheduler file (JSON with an address); fix compute.cluster"
            raise ClusterError(f"{where} {why}") from None
    if not address or not address.startswith("tcp://"):
        return
    host, port = address[len("tcp://") :].rsplit(":", 1)
    greeting = b""
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            while len(greeting) < 8 and (part := sock.recv(8 - len(greeting))):
                greeting += part
    except TimeoutError:
        pass
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise ClusterError(
            f"cannot reach the Dask scheduler at {where} within {timeout_s:g} s ({reason}); "
            "check compute.cluster and compute.security, or set compute.cluster: local"
        ) from None
    if len(greeting) < 8 or int.from_bytes(greeting, "little") > _MAX_GREETING:
        raise ClusterError(
            f"{address} answers but is not a Dask scheduler (no Dask greeting within {timeout_s:g} s: another "
            "service, or a tls:// one); check compute.cluster (the scheduler's port, usually 8786, not the dashboard's)"
        )


def unauthenticated_warning(cluster: str) -> str | None:
    """A one-line warning when ``cluster`` is plain ``tcp://`` to a host other than this machine's loopback: anyone
    who can reach that scheduler runs code on its workers (nothing is authenticated or encrypted); None otherwise."""
    if not cluster.startswith("tcp://") or not _ADDRESS.match(cluster):
        return None
    host = cluster.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: only localhost is known to stay on this machine
        loopback = host == "localhost"
    if loopback:
        return None
    return (f"warning: compute.cluster {cluster} is plain TCP: unauthenticated and unencrypted, anyone who reaches it "
            "runs code on its workers; use tls:// with compute.security (docs/scaling.md)")  # fmt: skip


def _client_kwargs(cluster: str, tls: SecurityParams | None) -> dict:
    if _ADDRESS.match(cluster):
        scheme = cluster.split("://")[0]
        if scheme == "tls" and tls is None:
            raise ClusterError(f"{cluster} is a TLS address: set compute.security (ca, cert, key PEM files)")
        if scheme == "tcp" and tls is not None:
            raise ClusterError(f"compute.security is set but {cluster} is plain tcp://; use its tls:// address")
        return {"address": cluster, "security": security(tls) if tls else None}
    if "://" in cluster:
        raise ClusterError(f"compute.cluster: {cluster!r} is not tcp://host:port, tls://host:port or a file")
    if not Path(cluster).is_file():
        raise ClusterError(f"compute.cluster: scheduler file {cluster} not found; start the scheduler or fix the path")
    return {"scheduler_file": cluster, "security": security(tls) if tls else None}


def map_on_cluster(client, fn: Callable, jobs: list, keys: list[str] | None = None) -> Iterator[tuple[int, object]]:
    """``fn(job)`` for every job on the cluster, yielded as ``(index, result)`` as they complete.

    A job that fails yields ``(index, exception)`` instead of stopping the others: the exception it
    raised, or a :class:`CheckpointJobError` (``WorkerLost`` / ``WorkerOutOfMemory``) when every
    worker that ran it died (Dask retries a job whose worker died ``distributed.scheduler.allowed-failures``
    times on other workers first, so one killed worker loses nothing). ``keys`` names the tasks
    (unique; shown on the dashboard); ``pure=False`` so that a re-run computes again.
    """
    from distributed import as_completed
    from distributed.scheduler import KilledWorker

    keys = keys or [None] * len(jobs)
    futures = {}
    for i, (job, key) in enumerate(zip(jobs, keys, strict=True)):
        future = client.submit(fn, job, key=key, pure=False, retries=0)
        futures[future] = i
    for future in as_completed(futures, loop=client.loop):
        i = futures.pop(future)
        if future.status == "finished":
            result = future.result()
            future.release()  # the worker frees its copy now, not when the caller is done with this one
            del future
            yield i, result
            continue
        err = future.exception()
        future.release()
        yield i, _lost(client, err) if isinstance(err, KilledWorker) else err


def _lost(client, err) -> CheckpointJobError:
    """Name a job whose workers all died: out of memory when the last one's nanny restarted it for that."""
    tries, last = err.allowed_failures + 1, err.last_worker
    try:
        logs = client.sync(_nanny_logs, last.nanny, client.connection_args) if last.nanny else []
    except OSError:  # the nanny itself is gone (e.g. its machine)
        logs = []
    if any("memory budget" in message for _level, message in logs):
        limit = f"{last.memory_limit / 2**30:.2f} GiB" if last.memory_limit else "unknown"
        return CheckpointJobError(
            "WorkerOutOfMemory",
            f"the job exceeded the worker memory limit ({limit}) on {tries} workers; "
            "give workers more memory (dask worker --memory-limit) or run fewer per machine",
        )
    return CheckpointJobError("WorkerLost", f"{tries} workers died running this job (last {last.address})")


async def _nanny_logs(address: str, connection_args: dict) -> list:
    from distributed.core import rpc

    async with rpc(address, connection_args=connection_args) as nanny:
        return await nanny.get_logs()


def local_cluster(workers: int, memory_limit: str | int | None = "auto", processes: bool = True):
    """A :class:`distributed.LocalCluster` on 127.0.0.1 of ``workers`` single-threaded workers.

    Each worker runs one job at a time (per-checkpoint jobs are single-threaded, like the process
    pool's). For tests and ``python -m bench scale``; no dashboard.
    """
    from distributed import LocalCluster

    host = {"host": "127.0.0.1"} if processes else {}
    return LocalCluster(n_workers=workers, threads_per_worker=1, processes=processes, memory_limit=memory_limit,
                        dashboard_address=None, **host)  # fmt: skip
