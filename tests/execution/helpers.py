"""Helpers shared by the execution tests. Dask workers import this module (through test_cluster, whose functions
they run), so it imports nothing beyond the standard library: see test_cluster's ``free_port``."""

import os


def worker_pids(client) -> dict[str, int]:
    """Worker address -> process id (to kill one in a fault test, or read its memory)."""
    return client.run(os.getpid)
