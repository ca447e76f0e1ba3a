"""Worker processes that die with the process they work for, even when it is killed with SIGKILL.

A SIGKILLed stage runs no cleanup, so its process-pool workers (blocked on a queue whose write end
they hold themselves), their fork server and multiprocessing's resource tracker would live on.
:func:`die_with` makes the calling process follow its parent (Linux ``PR_SET_PDEATHSIG``) and, on
every platform, exit within ``interval`` seconds of a given process being gone (a daemon thread).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with(pid: int, interval: float = 0.2) -> None:
    """Exit this process when process ``pid`` (the one it works for) or this process's parent dies."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent or not alive(pid):  # died before the request took effect
        os._exit(1)
    threading.Thread(target=_watch, args=(pid, interval), name=f"lifeline-{pid}", daemon=True).start()


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True  # no /proc: existence is all we can tell


def _watch(pid: int, interval: float) -> None:
    while alive(pid):
        time.sleep(interval)
    os._exit(1)
