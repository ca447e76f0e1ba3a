"""topometrics.execution.cost: per-family estimates linear in the parameter count, the families a memory (or the
disk of a large model's vectors) cannot hold, and a series told (and skipped) before anything is allocated."""

import tracemalloc
from types import SimpleNamespace

import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.repo_params import features_params
from topometrics.execution import cost
from topometrics.landscape import surface, vectors
from topometrics.landscape.surface import spilled_vectors
from topometrics.landscape.trace import Probes, adaptive_trace
from topometrics.series.source_shards import affordable


def test_costs_are_linear_in_the_parameters_and_group_the_weight_families():
    small = cost.checkpoint_costs(10_000_000, ["np", "vr", "spectral", "curvature", "representation"])
    large = cost.checkpoint_costs(40_000_000, ["np", "vr", "spectral", "curvature", "representation"])
    assert [c.family for c in small] == ["weights", "curvature"]  # no rate for representation: not listed
    for a, b in zip(small, large, strict=True):
        assert b.seconds == 4 * a.seconds
        assert b.peak_bytes - cost.FIXED_BYTES == 4 * (a.peak_bytes - cost.FIXED_BYTES)
    assert [c.family for c in cost.checkpoint_costs(10, ["landscape", "gradient"], surface=False)] == ["gradient"]


def test_a_pythia_160m_curvature_is_told_it_does_not_fit_3_gb():
    costs = cost.checkpoint_costs(162_322_944, ["np", "curvature"])
    too_big = cost.unaffordable(costs, 3 * cost.GIB)  # curvature adds ~3.6 GiB, the weight families ~1.2
    assert list(too_big) == ["curvature"] and "GB available" in too_big["curvature"]
    assert cost.skipped_families(["np", "vr", "curvature"], too_big) == ("curvature",)
    line = cost.plan_line(162_322_944, costs, checkpoints=19)
    assert line.startswith("estimate for 162.3M parameters") and "19 checkpoint(s)" in line
    weights, curvature = costs
    every_fifth = cost.plan_line(162_322_944, costs, checkpoints=19, surface_every=5)  # 4 of 19 get the surface
    assert f"~{(19 * weights.seconds + 4 * curvature.seconds) / 3600:.2f} h" in every_fifth


def test_the_curvature_peak_holds_the_float32_trace_deflated_by_ritz_vectors_in_a_file(scratch, monkeypatch):
    dim = 1_000_000
    monkeypatch.setattr(vectors, "CHUNK", 1 << 14)  # chunks as small beside this vector as beside a Pythia's
    rows = vectors.file_rows(scratch, 3, dim)  # as the two-pass Lanczos leaves them
    for i in range(3):
        vectors.add_rows(rows, np.eye(3)[i], np.random.default_rng(i).standard_normal(dim).astype(np.float32))

    def product(v):  # the result of an exact float32 product, its vector read from its file in parts (as
        # slice.exact_hvp reads it; the product's own working set is counted apart)
        out = np.empty(dim, dtype=np.float32)
        for start, part in vectors.parts(v):
            out[start : start + len(part)] = part * np.float32(2.0)
        return out

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        adaptive_trace(product, dim, Probes(8, 0.05, 8), seed=0, basis=rows, dtype=np.float32)
        trace_bytes = (tracemalloc.get_traced_memory()[1] - before) / dim
    finally:
        tracemalloc.stop()
    # a probe and its int8 draw (5 B) as it is drawn, then the product's result (4 B: the probe waits in a file);
    # with the model (4) and the product's own working set (8, measured) within the curvature's bytes
    assert trace_bytes >= 5 and trace_bytes + 4 + 8 <= cost.BYTES_PER_PARAMETER["curvature"]


def checkpoints_of(tmp_path, rows, cols):
    path = tmp_path / "model.safetensors"
    save_file({"w": np.zeros((rows, cols), dtype=np.float32), "b": np.zeros(cols, dtype=np.float32)}, str(path))
    return [{"revision": "bad", "status": "skipped"}, ("step-10", 10, SimpleNamespace(weights=(path,)))]


def test_a_series_whose_largest_tensor_cannot_be_read_is_skipped_in_one_line(tmp_path):
    lines = []
    params = features_params()
    kept, why = affordable("s", checkpoints_of(tmp_path, 64, 32), params, lines.append, available=12 * 64 * 32 - 1)
    assert kept is params and why.startswith("its largest tensor needs ~0.0 GB to read")
    assert lines == [f"s: skipped: {why}"]


def test_families_that_do_not_fit_are_taken_out_with_the_gb_they_need(tmp_path):
    lines = []
    params = features_params()
    checkpoints = checkpoints_of(tmp_path, 64, 32)
    parameters = 64 * 32 + 32
    # room for every family but those with the most bytes per parameter
    most = max(cost.BYTES_PER_PARAMETER.values())
    largest = {f for f, b in cost.BYTES_PER_PARAMETER.items() if b == most}
    room = parameters * (most - 1)  # beyond what the process already holds
    kept, why = affordable("s", checkpoints, params, lines.append, available=room)
    assert why is None and largest <= set(params.families) and not largest & set(kept.families)
    assert set(kept.families) == set(params.families) - largest
    assert lines[0].startswith("s: estimate for 0.0M parameters") and "1 checkpoint(s)" in lines[0]
    assert all(f"{family} skipped on every checkpoint: needs ~" in "\n".join(lines) for family in largest)
    plenty, _ = affordable("s", checkpoints, params, lines.append, available=64 * cost.GIB)
    assert plenty is params


def test_on_cuda_the_plan_says_its_seconds_are_the_cpus_rates_only_when_a_family_runs_the_model():
    costs = cost.checkpoint_costs(85_000_000, ["np", "gradient", "landscape"])
    assert "cuda" not in cost.plan_line(85_000_000, costs, device="cpu")
    line = cost.plan_line(85_000_000, costs, device="cuda")
    assert "(gradient, landscape will run on cuda: these are one CPU thread's rates" in line
    assert line.startswith(cost.plan_line(85_000_000, costs))  # the same numbers, the caveat appended
    weights_only = cost.checkpoint_costs(85_000_000, ["np", "vr"])
    assert cost.plan_line(85_000_000, weights_only, device="cuda") == cost.plan_line(85_000_000, weights_only)


def test_the_curvature_is_told_at_its_least_and_most_probes_and_the_plan_gives_both_totals():
    rated = cost.checkpoint_costs(85_000_000, ["np", "curvature"])
    weights, curvature = cost.checkpoint_costs(85_000_000, ["np", "curvature"], probes=(8, 400))
    assert weights == rated[0] and weights.seconds_max is None
    # the rate is of 50 products (42 + 8 probes): at 8 probes the same seconds, at 400 the products of 442
    assert curvature.seconds == pytest.approx(rated[1].seconds, rel=1e-12)
    assert curvature.seconds_max == pytest.approx(rated[1].seconds * 442 / 50, rel=1e-12)
    assert cost.checkpoint_costs(85_000_000, ["curvature"], probes=(16, 16))[0].seconds == pytest.approx(
        rated[1].seconds * 58 / 50, rel=1e-12
    )
    line = cost.plan_line(85_000_000, [weights, curvature], checkpoints=19, surface_every=5)
    assert f"curvature {curvature.seconds:.0f} s (up to {curvature.seconds_max:.0f} s at a random init)" in line
    low, high = (19 * weights.seconds + 4 * s for s in (curvature.seconds, curvature.seconds_max))
    assert f"~{low / 3600:.2f} h (up to ~{high / 3600:.2f} h if every trace takes its most probes)" in line
    assert "up to" not in cost.plan_line(85_000_000, rated[:1])


def test_on_a_gpu_the_families_that_run_the_model_must_fit_its_free_memory_too():
    costs = cost.checkpoint_costs(302_573_568, ["np", "gradient", "landscape"])  # the 410M shape
    landscape = next(c for c in costs if c.family == "landscape")
    gpu_need = landscape.peak_bytes - cost.FIXED_BYTES
    assert cost.unaffordable(costs, 64 * cost.GIB, gpu_need) == {}
    too_big = cost.unaffordable(costs, 64 * cost.GIB, gpu_need - 1)
    assert list(too_big) == ["landscape"]  # the gradient's pass needs less; the weight families stay on the host
    assert too_big["landscape"] == (
        f"needs ~{gpu_need / cost.GIB:.1f} GB of GPU memory, {(gpu_need - 1) / cost.GIB:.1f} GB free on the GPU "
        "(estimated)"
    )
    host_short = cost.unaffordable(costs, gpu_need - 1, 0)  # short on both: the host's reason is the one told
    assert "GB available" in host_short["landscape"] and "GPU" in host_short["gradient"]
    assert "weights" not in cost.unaffordable(costs, 64 * cost.GIB, 0)


def test_a_series_on_a_gpu_too_small_for_the_largest_model_running_families_keeps_every_other_family(tmp_path):
    lines = []
    params = features_params()
    checkpoints = checkpoints_of(tmp_path, 64, 32)
    parameters = 64 * 32 + 32
    most = max(cost.BYTES_PER_PARAMETER[f] for f in cost.MODEL_RUNNING)
    largest = {f for f in cost.MODEL_RUNNING if cost.BYTES_PER_PARAMETER[f] == most}
    gpu = parameters * (most - 1)  # room on the GPU for every model-running family but those
    kept, why = affordable("s", checkpoints, params, lines.append, available=64 * cost.GIB, gpu_available=gpu)
    assert why is None and largest and largest <= set(params.families)
    assert set(kept.families) == set(params.families) - largest
    for family in largest:
        assert (
            f"s: {family} skipped on every checkpoint: needs ~0.0 GB of GPU memory, 0.0 GB free on the GPU "
            "(estimated)" in lines
        )
    assert affordable("s", checkpoints, params, lines.append, available=64 * cost.GIB)[0] is params  # CPU: no GPU


def test_a_large_models_surface_is_told_its_disk_and_skipped_where_the_disk_cannot_hold_its_vectors():
    n = 302_573_568  # the 410M shape: its Lanczos basis is not kept, 6 vectors wait in files at once
    spilled = spilled_vectors(n, 20, 3)
    assert spilled == 6 and spilled_vectors(1_000_000, 20, 3) == 0  # a ladder rung's vectors stay in memory
    costs = cost.checkpoint_costs(n, ["np", "landscape", "curvature"], spilled=spilled)
    need = {c.family: c.scratch_bytes for c in costs}
    assert need == {"weights": 0, "landscape": 4 * 6 * n, "curvature": 4 * 6 * n}
    assert "landscape 2518 s / 6.6 GB + 6.8 GB of disk" in cost.plan_line(n, costs)
    assert cost.unaffordable(costs, 64 * cost.GIB, scratch=("/big", 4 * 6 * n)) == {}
    too_big = cost.unaffordable(costs, 64 * cost.GIB, scratch=("/small", 4 * 6 * n - 1))
    assert too_big == dict.fromkeys(
        ["landscape", "curvature"],
        "needs ~6.8 GB of disk for its vectors in /small, 6.8 GB free there (TMPDIR names the folder)",
    )
    short = cost.unaffordable(costs, 1 * cost.GIB, scratch=("/small", 0))  # short of memory too: that is told
    assert all("GB available" in why for why in short.values())


def test_a_series_whose_surface_vectors_do_not_fit_the_scratch_disk_keeps_every_other_family(tmp_path, monkeypatch):
    monkeypatch.setattr(surface, "BASIS_BYTES", 0)  # this tiny model then takes the large model's path
    lines, params = [], features_params()
    enough = vectors.scratch_space()
    assert enough[0] == vectors.scratch_folder() and enough[1] > 0
    room = (enough[0], 64 * cost.GIB)
    kept, why = affordable("s", checkpoints_of(tmp_path, 64, 32), params, lines.append, 64 * cost.GIB, None, room)
    assert kept is params and "landscape 0 s / 1.0 GB + 0.0 GB of disk" in lines[0]
    assert "random init) / 1.0 GB + 0.0 GB of disk" in lines[0]  # the curvature's, with its probes' seconds
    full = ("/full", 0)
    kept, why = affordable("s", checkpoints_of(tmp_path, 64, 32), params, lines.append, 64 * cost.GIB, None, full)
    assert why is None and set(kept.families) == set(params.families) - {"landscape", "curvature"}
    told = "\n".join(lines)
    assert "s: curvature skipped on every checkpoint: needs ~0.0 GB of disk for its vectors in /full" in told
