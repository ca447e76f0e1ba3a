"""Tests of topometrics.execution.compute: map_jobs in worker processes and in this process."""

import os

import pytest
import torch
from threadpoolctl import threadpool_info

from tests.repo_params import compute_params
from topometrics.execution.compute import background_pool, map_jobs


def square_and_where(x):
    """A job (module level, so it pickles): x^2, the pid that computed it and its torch threads."""
    return x * x, os.getpid(), torch.get_num_threads()


def blas_threads(_=None) -> int:
    """A job: the most threads any BLAS or OpenMP pool of this process may use (1 when none is loaded)."""
    import numpy as np

    np.ones((2, 2)) @ np.ones((2, 2))  # BLAS is loaded
    return max((pool["num_threads"] for pool in threadpool_info()), default=1)


def fail_on_three(x):
    if x == 3:
        raise ValueError("job 3 failed")
    return x


def test_map_keeps_the_order_and_runs_in_one_thread_workers():
    out = map_jobs(square_and_where, list(range(24)), workers=2, label="test")
    assert [value for value, _, _ in out] == [x * x for x in range(24)]
    assert os.getpid() not in {pid for _, pid, _ in out}
    assert {threads for _, _, threads in out} == {1}


def test_a_background_pool_is_one_worker_of_one_torch_and_one_blas_thread():
    with background_pool(square_and_where) as pool:
        results = [pool.submit(square_and_where, x).result() for x in range(3)]
        blas = pool.submit(blas_threads).result()
    assert [value for value, _, _ in results] == [0, 1, 4]
    pids = {pid for _, pid, _ in results}
    assert len(pids) == 1 and os.getpid() not in pids  # one worker, another process
    assert {threads for _, _, threads in results} == {1} and blas == 1


def test_few_jobs_run_here_in_one_thread_and_the_thread_count_is_restored():
    before = torch.get_num_threads()
    out = map_jobs(square_and_where, [1, 2, 3], workers=2, label="test")  # fewer than 4 jobs per worker
    assert [(value, pid, threads) for value, pid, threads in out] == [(x * x, os.getpid(), 1) for x in (1, 2, 3)]
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("workers", [1, 2])
def test_a_job_error_is_raised(workers):
    with pytest.raises(ValueError, match="job 3 failed"):
        map_jobs(fail_on_three, list(range(8)), workers=workers, label="test")


def test_progress_lines_go_to_stderr(capfd):
    map_jobs(abs, [-1, -2], workers=1, label="things")
    err = capfd.readouterr().err
    assert "things: 2/2 checkpoints" in err


# --- the same seam on a Dask cluster ----------------------------------------------------------------


def test_each_result_yields_failures_as_results_and_runs_the_rest():
    from topometrics.execution.compute import each_result

    for workers in (1, 2):
        got = dict(each_result(fail_on_three, list(range(8)), workers=workers, label="test"))
        assert sorted(got) == list(range(8))
        assert isinstance(got[3], ValueError) and str(got[3]) == "job 3 failed"
        assert all(got[i] == i for i in got if i != 3)


def test_map_jobs_on_a_dask_cluster_equals_local_and_runs_one_thread_jobs():
    from distributed import LocalCluster

    local = map_jobs(square_and_where, list(range(6)), workers=1, label="test")
    with LocalCluster(n_workers=2, processes=False, protocol="tcp://", host="127.0.0.1", dashboard_address=None) as c:
        cluster = compute_params(cluster=c.scheduler_address)
        remote = map_jobs(square_and_where, list(range(6)), workers=1, label="test", compute=cluster)
        with pytest.raises(ValueError, match="job 3 failed"):
            map_jobs(fail_on_three, list(range(6)), workers=1, label="test", compute=cluster)
    assert [v for v, _, _ in remote] == [v for v, _, _ in local]
    assert {threads for _, _, threads in remote} == {1}


def test_an_unreachable_cluster_fails_before_any_job_runs(tmp_path):
    from topometrics.execution.cluster import ClusterError
    from topometrics.execution.compute import each_result

    address = "tcp://127.0.0.1:9"  # discard port: nothing listens
    ran = tmp_path / "ran"
    with pytest.raises(ClusterError, match=f"^cannot reach the Dask scheduler at {address} within 1 s"):
        compute = compute_params(cluster=address, connect_timeout_s=1)
        list(each_result(touch, [ran], workers=1, label="test", compute=compute))
    assert not ran.exists()


def touch(path):
    path.touch()
    return path
