"""Tests of topometrics.compute: map_jobs in worker processes and in this process."""

import os

import pytest
import torch

from topometrics.compute import map_jobs


def square_and_where(x):
    """A job (module level, so it pickles): x^2, the pid that computed it and its torch threads."""
    return x * x, os.getpid(), torch.get_num_threads()


def fail_on_three(x):
    if x == 3:
        raise ValueError("job 3 failed")
    return x


def test_map_keeps_the_order_and_runs_in_one_thread_workers():
    out = map_jobs(square_and_where, list(range(24)), workers=2, label="test")
    assert [value for value, _, _ in out] == [x * x for x in range(24)]
    assert os.getpid() not in {pid for _, pid, _ in out}
    assert {threads for _, _, threads in out} == {1}


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
