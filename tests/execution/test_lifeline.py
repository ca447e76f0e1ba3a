"""topometrics.execution.lifeline: a worker exits when the process it works for is gone, even after a SIGKILL."""

import os
import signal
import subprocess
import sys
import time

from topometrics.execution.lifeline import alive

WORKER = """
import sys, time
from topometrics.execution.lifeline import die_with
die_with(int(sys.argv[1]), interval=0.05)
print("watching", flush=True)
time.sleep(60)
"""


def test_alive_tells_a_running_process_from_a_reaped_and_a_zombie_one():
    assert alive(os.getpid())
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    assert not alive(done.pid)  # reaped: no such process
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while alive(zombie.pid) and time.monotonic() < deadline:  # exited but not waited for: a zombie
        time.sleep(0.05)
    assert not alive(zombie.pid)
    zombie.wait()


def test_a_worker_exits_soon_after_the_process_it_works_for_is_killed_with_sigkill():
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(owner.pid)], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline() == "watching\n"
        assert worker.poll() is None  # alive while its owner is
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        assert worker.wait(timeout=30) == 1
    finally:
        for proc in (owner, worker):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_worker_whose_owner_is_already_gone_exits_at_once():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    worker = subprocess.run([sys.executable, "-c", WORKER, str(gone.pid)], capture_output=True, text=True, timeout=60)
    assert worker.returncode == 1 and worker.stdout == ""
