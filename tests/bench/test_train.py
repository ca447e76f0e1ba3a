"""bench train's CPU path end to end on one rung, and its device argument."""

import json

import pytest
import torch

from bench import train as bench_train
from topometrics.models.model import GPTConfig
from topometrics.training.train import Recipe, RunConfig


def test_a_rung_is_timed_on_the_cpu_device_and_a_gpu_sweep_runs_one_at_a_time():
    cfg = RunConfig(
        "t", GPTConfig(hidden=8, layers=1, heads=1, context=16), Recipe(10, 5, 4, 1e-3, 1, 0.0, 0.0, 1.0, 0, 4)
    )
    timing = bench_train.time_rung(cfg, "serial", steps=2, warmup=1, device=torch.device("cpu"))
    assert timing["step_s"] > 0 and timing["ckpt_s"] > 0 and timing["extra_s"] >= 0
    # no parallel rates (a GPU run): the serial ones, one process, no pool start-up
    (sweep,) = bench_train.sweep_projections([(("t",), 2, 2, 10, None)], {"naive": {}, "serial": {"t": timing}}, 5, 1)
    run_s = 10 * timing["step_s"] + 3 * timing["ckpt_s"] + timing["extra_s"]
    assert sweep["runs"] == 4 and sweep["wall_hours"] == round(4 * run_s / 3600, 2)


@pytest.mark.slow
def test_bench_train_times_a_rung_on_cpu_and_projects_a_sweep(capsys):
    argv = ["--rungs", "tiny", "--steps", "2", "--warmup", "1", "--modes", "naive,serial", "--cores", "1"]
    assert bench_train.main([*argv, "--device", "cpu", "--sweep", "tiny:2:3:100"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["device"] == "cpu" and set(result["modes"]) == {"naive", "serial", "parallel"}
    (sweep,) = result["sweeps"]
    assert (sweep["runs"], sweep["steps"], sweep["workers"]) == (6, 100, 1)
    # one process: the six runs one after another, each at least its 100 timed-rate steps
    assert sweep["run_hours_total"] <= sweep["wall_hours"] + 0.01
    assert sweep["run_minutes"]["tiny"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_asking_for_cuda_without_a_device_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        bench_train.main(["--device", "cuda", "--rungs", "tiny"])
    assert "no CUDA device is visible" in capsys.readouterr().err
