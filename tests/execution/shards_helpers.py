"""Helpers of the shards tests and the script they run in a subprocess: a frame per job, jobs run in this
process, and tasks for steps. Not in helpers.py, which Dask workers import and must stay light."""

import numpy as np
import pandas as pd

from topometrics.execution.shards import Fingerprint, ShardKey, Task


def frame(step: int, n: int = 3) -> pd.DataFrame:
    return pd.DataFrame({"rung": "tiny", "seed": 1, "step": step, "feature": [f"f{i}" for i in range(n)],
                         "value": np.arange(n, dtype=float) + step})  # fmt: skip


def in_process(fn, jobs):
    for i, job in enumerate(jobs):
        try:
            yield i, fn(job)
        except ValueError as err:
            yield i, err


def tasks_for(steps, params="p1"):
    return [Task(ShardKey("tiny", "base", 1, s), Fingerprint(f"w{s}", params, "c1"), s) for s in steps]
