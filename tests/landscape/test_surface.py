"""topometrics.landscape.surface: one checkpoint's loss-surface values are invariant where they must be
(hidden-unit permutations, a constant added to the loss) and NULL with the reason where they cannot be
computed (a non-finite slice, an unconverged Lanczos run, fewer eigenvalues kept)."""

import os
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from topometrics.landscape import surface as surface_module
from topometrics.landscape import vectors as vectors_module
from topometrics.landscape.slice import exact_hvp, functional_loss, loss_grid, random_direction
from topometrics.landscape.sublevel import SUMMARY_KEYS
from topometrics.landscape.surface import (
    CURVATURE_KEYS,
    GRID_PARAMETERS,
    LANCZOS_TOL,
    SurfaceSettings,
    curvature_values,
    grid_chunk,
    slice_curvature,
    slice_values,
    surface_values,
)
from topometrics.landscape.vectors import FileRows, read_part, scratch_folder

# dim = 3*6 + 6 + 6 + 1 = 31 <= iters: Lanczos converges (or exhausts the Krylov space) within its budget
SETTINGS = SurfaceSettings(grid=7, radius=0.5, top=3, probes=4, iters=40, seed=0)


def mlp_loss(hidden_order=None, shift=0.0):
    """A tanh network's mean squared error, float64; ``hidden_order`` permutes its hidden units."""
    torch.manual_seed(0)
    x, y = torch.randn(24, 3, dtype=torch.float64), torch.randn(24, 1, dtype=torch.float64)
    model = nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 1)).double()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    if hidden_order is not None:
        params["0.weight"], params["0.bias"] = params["0.weight"][hidden_order], params["0.bias"][hidden_order]
        params["2.weight"] = params["2.weight"][:, hidden_order]
    return functional_loss(model, lambda call: ((call(x) - y) ** 2).mean() + shift), params


def test_permuting_the_hidden_units_leaves_the_curvature_and_both_slices_unchanged():
    order = torch.tensor([4, 2, 0, 5, 1, 3])
    loss, params = mlp_loss()
    loss_p, params_p = mlp_loss(order)
    landscape, curvature = surface_values(loss, params, SETTINGS)
    landscape_p, curvature_p = surface_values(loss_p, params_p, SETTINGS)
    # one-sided difference products are exact to ~1e-8 and Lanczos stops once the residual bound is under
    # LANCZOS_TOL (the Ritz values then err far less, quadratically): a permuted start agrees to 1e-5
    for key in ("eig1", "eig2", "eig3"):
        assert curvature_p.values[key] == pytest.approx(curvature.values[key], rel=1e-5)
    for key in SUMMARY_KEYS:  # the Hessian's eigenvectors permute with the units (up to sign: a reflection)
        assert landscape_p.values[f"hess_{key}"] == pytest.approx(landscape.values[f"hess_{key}"], rel=1e-6, abs=1e-12)
    # random directions drawn for one model, permuted with it, give the same slice
    gen = torch.Generator().manual_seed(1)
    d1, d2 = random_direction(params, gen), random_direction(params, gen)
    permuted = []
    for d in (d1, d2):
        moved = dict(d)
        moved["0.weight"], moved["0.bias"], moved["2.weight"] = (
            d["0.weight"][order],
            d["0.bias"][order],
            d["2.weight"][:, order],
        )
        permuted.append(moved)
    assert slice_values(loss_p, params_p, tuple(permuted), SETTINGS) == slice_values(loss, params, (d1, d2), SETTINGS)
    assert not landscape.reasons and not curvature.reasons


def test_adding_a_constant_to_the_loss_changes_no_value():
    (a, b), (c, d) = surface_values(*mlp_loss(), SETTINGS), surface_values(*mlp_loss(shift=7.0), SETTINGS)
    for key, value in a.values.items():
        assert c.values[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
    for key, value in b.values.items():
        assert d.values[key] == pytest.approx(value, rel=1e-9), key


def test_the_curvature_of_a_quadratic_is_its_matrix_and_the_top_ratio_follows():
    h = np.diag([5.0, 3.0, 2.0, 1.0, 0.5])
    loss = lambda p: 0.5 * p["w"] @ torch.as_tensor(h) @ p["w"]  # noqa: E731
    params = {"w": torch.zeros(5, dtype=torch.float64)}
    _, curvature = surface_values(loss, params, SurfaceSettings(grid=5, radius=1.0, top=3, probes=2, iters=10, seed=3))
    # 5 parameters, under hessian_exact_max: the trace is exact and its standard error 0
    assert [curvature.values[k] for k in CURVATURE_KEYS] == pytest.approx([5.0, 3.0, 2.0, 11.5, 5.0 / 11.5, 0.0])


def test_a_non_finite_loss_on_the_slice_is_null_with_the_reason_and_the_curvature_stays():
    loss, params = mlp_loss()

    def blows_up(p):  # finite near the weights, infinite where the first bias moves far
        value = loss(p)
        return torch.where(p["0.weight"].abs().max() > params["0.weight"].abs().max() * 1.2, torch.inf, value)

    landscape, curvature = surface_values(blows_up, params, SETTINGS)
    assert np.isnan(landscape.values["rand_minima"])
    assert landscape.reasons["rand_minima"].startswith("non-finite loss at ")
    assert "of 49 slice points" in landscape.reasons["rand_range"]
    assert landscape.reasons["rand_curv"] == landscape.reasons["rand_range"]  # a NULL slice has no curvature
    assert not curvature.reasons and np.isfinite(curvature.values["eig1"])


def test_an_unconverged_lanczos_run_nulls_its_eigenvalues_and_the_hess_slice():
    loss, params = mlp_loss()
    landscape, curvature = surface_values(loss, params, SETTINGS._replace(iters=3))
    assert curvature.reasons["eig1"] == "Lanczos did not converge in 3 steps (features.hessian_iters)"
    assert curvature.reasons["eig1_over_trace"] == curvature.reasons["eig1"]
    assert "trace" not in curvature.reasons  # Hutchinson has no convergence test: its value stands
    assert set(landscape.reasons) == {f"hess_{k}" for k in (*SUMMARY_KEYS, "curv")}  # the slice's curvature too
    assert all(np.isnan(landscape.values[f"hess_{k}"]) for k in SUMMARY_KEYS)
    assert all(np.isfinite(landscape.values[f"rand_{k}"]) for k in SUMMARY_KEYS)


def test_the_default_products_and_early_stop_agree_with_central_differences_over_the_whole_budget():
    loss, params = mlp_loss()
    settings = SETTINGS._replace(iters=30)  # under dim = 31: the full run does not exhaust the Krylov space
    fast, fast_dirs = curvature_values(loss, params, settings)
    full, full_dirs = curvature_values(loss, params, settings, one_sided=False, stop_early=False)
    assert not fast.reasons and not full.reasons
    for key in ("eig1", "eig2", "eig3"):  # the residual bound: within LANCZOS_TOL of an eigenvalue
        assert fast.values[key] == pytest.approx(full.values[key], rel=LANCZOS_TOL)
    assert fast.values["trace"] == pytest.approx(full.values["trace"], rel=1e-6)  # the same probes
    for a, b in zip(fast_dirs, full_dirs, strict=True):  # the same top-2 directions, up to sign
        cos = sum(float((a[k] * b[k]).sum()) for k in a) / np.sqrt(
            sum(float((a[k] ** 2).sum()) for k in a) * sum(float((b[k] ** 2).sum()) for k in b)
        )
        assert abs(cos) == pytest.approx(1.0, abs=1e-3)


def test_keeping_fewer_eigenvalues_says_so():
    _, curvature = surface_values(*mlp_loss(), SETTINGS._replace(top=1))
    assert np.isnan(curvature.values["eig2"]) and np.isnan(curvature.values["eig3"])
    assert curvature.reasons["eig3"] == "features.hessian_top = 1 keeps fewer eigenvalues"
    assert np.isfinite(curvature.values["eig1"])


def test_the_grid_goes_in_as_few_vmapped_passes_as_the_parameter_budget_allows():
    small = {"w": torch.zeros(100, 10)}
    assert grid_chunk(small, 15) == 225  # the whole grid in one pass
    big = {"w": torch.zeros(GRID_PARAMETERS // 3 + 1)}
    assert grid_chunk(big, 15) == 2
    assert grid_chunk({"w": torch.zeros(GRID_PARAMETERS + 1)}, 15) == 1  # a plain loop


def test_the_grid_in_one_vmapped_pass_gives_the_plain_loops_summaries():
    loss, params = mlp_loss()
    gen = torch.Generator().manual_seed(1)
    d = (random_direction(params, gen), random_direction(params, gen))
    batched, _ = slice_values(loss, params, d, SETTINGS._replace(chunk=grid_chunk(params, SETTINGS.grid)))
    looped, _ = slice_values(loss, params, d, SETTINGS)  # 0: a plain loop on CPU
    assert batched == pytest.approx(looped, rel=1e-12, abs=1e-12)


def test_the_global_range_is_the_radius_one_slices_range_on_the_coarse_grid_and_at_most_the_fine_ones():
    loss, params = mlp_loss()
    landscape, _ = surface_values(loss, params, SETTINGS)
    gen = torch.Generator().manual_seed(SETTINGS.seed)  # the rand slice's directions, drawn as surface_values draws
    rand = (random_direction(params, gen), random_direction(params, gen))
    coarse, _ = slice_values(loss, params, rand, SETTINGS._replace(radius=1.0, grid=5))
    fine, _ = slice_values(loss, params, rand, SETTINGS._replace(radius=1.0, grid=13))  # 5 points are among its 13
    assert landscape.values["rand_range_global"] == coarse["range"]
    assert landscape.values["rand_range"] < coarse["range"] <= fine["range"]  # radius 0.5 < 1 on this network


def dense_hessian(loss, params):
    """The ``(dim, dim)`` Hessian of ``loss`` over ``params`` flattened in their order (torch.autograd)."""
    names, shapes, sizes = list(params), [p.shape for p in params.values()], [p.numel() for p in params.values()]

    def flat_loss(w):
        return loss({n: part.reshape(s) for n, part, s in zip(names, torch.split(w, sizes), shapes, strict=True)})

    return torch.autograd.functional.hessian(flat_loss, torch.cat([p.reshape(-1) for p in params.values()])).numpy()


def test_the_slice_curvature_is_the_dense_hessians_and_the_slices_second_difference_at_the_centre():
    loss, params = mlp_loss()
    landscape, curvature = surface_values(loss, params, SETTINGS)
    dense = dense_hessian(loss, params)
    assert curvature.values["trace"] == pytest.approx(np.trace(dense), rel=1e-6) and curvature.values["trace_se"] == 0
    gen = torch.Generator().manual_seed(SETTINGS.seed)
    rand = (random_direction(params, gen), random_direction(params, gen))
    flat = [torch.cat([t.reshape(-1) for t in d.values()]).numpy() for d in rand]
    assert landscape.values["rand_curv"] == pytest.approx(np.mean([d @ dense @ d for d in flat]), rel=1e-6)
    h = 1e-3  # a 3 x 3 slice of half-width h: second differences along each axis, error O(h^2)
    grid = loss_grid(loss, params, *rand, h, 3)
    second = [(grid[2, 1] - 2 * grid[1, 1] + grid[0, 1]) / h**2, (grid[1, 2] - 2 * grid[1, 1] + grid[1, 0]) / h**2]
    assert landscape.values["rand_curv"] == pytest.approx(np.mean(second), rel=1e-4)
    eig = np.linalg.eigvalsh(dense)[::-1]
    assert curvature.values["eig1"] == pytest.approx(eig[0], rel=LANCZOS_TOL)
    assert np.isfinite(landscape.values["hess_curv"]) and not landscape.reasons


def test_a_slice_curvature_that_uses_up_its_directions_gives_the_same_value_and_empties_them():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 1))  # float32, as a large model's products
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    hvp, _ = exact_hvp([functional_loss(model, lambda call: ((call(x) - y) ** 2).mean())], params)
    gen = torch.Generator().manual_seed(3)
    kept = (random_direction(params, gen), random_direction(params, gen))
    used = tuple({k: v.clone() for k, v in d.items()} for d in kept)
    # the products read each direction from its file, the dots a chunk at a time: the same float32 arithmetic
    assert slice_curvature(hvp, used, np.float32, consume=True) == slice_curvature(hvp, kept, np.float32)
    assert used == ({}, {}) and all(len(d) == len(params) for d in kept)


def test_a_used_up_slice_curvature_holds_no_direction_in_memory_through_a_product():
    n = 100_000  # float32 tensors over numpy arrays, so tracemalloc sees every direction's bytes
    rng = np.random.default_rng(0)
    scale = np.arange(1, 2 * n + 1, dtype=np.float32)
    held = []

    def hvp(v):  # H = diag(1..2n): d^T H d known; records what is allocated as each product starts
        held.append(tracemalloc.get_traced_memory()[0])
        if isinstance(v, FileRows):  # as slice.exact_hvp does: a part at a time into the result
            return np.concatenate([scale[i : i + n] * read_part(v, 0, i, i + n) for i in (0, n)])
        return v * scale

    kept = tuple({k: torch.from_numpy(rng.standard_normal(n).astype(np.float32)) for k in "ab"} for _ in "12")
    expected = np.mean([sum(float((t.double() ** 2 * torch.arange(1, 2 * n + 1)[i * n : (i + 1) * n]).sum())
                            for i, t in enumerate(d.values())) for d in kept])  # fmt: skip
    tracemalloc.start()
    try:
        used = tuple({k: torch.from_numpy(t.numpy().copy()) for k, t in d.items()} for d in kept)
        value, reason = slice_curvature(hvp, used, np.float32, consume=True)
    finally:
        tracemalloc.stop()
    vector = 2 * n * 4  # bytes of one flat direction
    assert reason is None and value == pytest.approx(expected, rel=1e-5) and used == ({}, {})
    # as each product starts: no direction (both in their files, their tensors gone), where one flat direction
    # was held through its own product before
    assert len(held) == 2 and all(h < 0.25 * vector for h in held)
    assert value == slice_curvature(hvp, kept, np.float32)[0]  # bit for bit what the kept directions give


def test_the_slice_curvature_is_null_with_the_hess_slices_reason_when_lanczos_did_not_converge():
    landscape, _ = surface_values(*mlp_loss(), SETTINGS._replace(iters=3))
    assert np.isnan(landscape.values["hess_curv"]) and landscape.reasons["hess_curv"] == landscape.reasons["hess_range"]
    assert np.isfinite(landscape.values["rand_curv"])


def test_above_exact_max_the_trace_is_estimated_within_its_standard_error_of_the_dense_trace():
    loss, params = mlp_loss()
    exact = np.trace(dense_hessian(loss, params))
    _, curvature = surface_values(loss, params, SETTINGS._replace(exact_max=30))  # dim 31: estimated
    se = curvature.values["trace_se"]
    assert 0 < se <= SETTINGS.trace_rse * abs(curvature.values["trace"])
    assert abs(curvature.values["trace"] - exact) < 4 * se


def test_a_large_models_float32_path_gives_the_float64_paths_curvature_and_hess_slice(monkeypatch, tmp_path):
    from tests.landscape.helpers import gpt_loss, params_of
    from topometrics.landscape import surface
    from topometrics.models.model import GPT

    model, x, y, loss = gpt_loss()  # float64: the products by differences, the kept basis
    # the trace estimated (exact: one product per parameter) from at most 8 probes, to keep this test short
    settings = SurfaceSettings(grid=5, radius=0.5, top=3, probes=4, iters=20, seed=0, exact_max=0, probes_max=8)
    reference, reference_directions = curvature_values(loss, params_of(model), settings)
    single = GPT(model.cfg)
    single.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    params = params_of(single)

    def window(i):
        return functional_loss(single, lambda call: nn.functional.cross_entropy(call(x[i : i + 1])[0], y[i]))

    whole = functional_loss(single, lambda call: nn.functional.cross_entropy(call(x).reshape(-1, 16), y.reshape(-1)))
    monkeypatch.setattr(surface, "BASIS_BYTES", 0)  # this model is then "large": float32, two passes, a file
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    found, directions = curvature_values(whole, params, settings, windows=[window(i) for i in range(len(x))])
    assert not any(found.reasons) and not any(reference.reasons)
    for key in CURVATURE_KEYS[:3]:  # the eigenvalues: float32 products, an order below the tolerance
        assert found.values[key] == pytest.approx(reference.values[key], rel=1e-4), key
    difference = abs(found.values["trace"] - reference.values["trace"])  # other probes: within their errors
    assert difference < 3 * np.hypot(found.values["trace_se"], reference.values["trace_se"])
    for ours, theirs in zip(directions, reference_directions, strict=True):
        a = torch.cat([t.reshape(-1) for t in ours.values()]).double()
        b = torch.cat([t.reshape(-1) for t in theirs.values()])
        assert abs(float(a @ b) / float(a.norm() * b.norm())) == pytest.approx(1.0, abs=1e-4)  # up to sign
    landscape, curvature = surface_values(whole, params, settings, [window(i) for i in range(len(x))])
    assert np.isfinite(list(landscape.values.values())).all() and not landscape.reasons
    assert list(tmp_path.iterdir()) == []  # the vectors' files never had a name there


def test_a_family_that_is_off_is_not_computed_and_the_other_keeps_its_values(monkeypatch):
    both = surface_values(*mlp_loss(), SETTINGS)
    landscape, no_curvature = surface_values(*mlp_loss(), SETTINGS, curvature=False)
    no_landscape, curvature = surface_values(*mlp_loss(), SETTINGS, landscape=False)
    assert no_curvature is None and no_landscape is None
    assert landscape == both[0] and curvature == both[1]  # the same values, reasons included
    # without the curvature no trace is estimated; without the landscape no slice is evaluated
    monkeypatch.setattr(surface_module, "hessian_trace", _never)
    surface_values(*mlp_loss(), SETTINGS, curvature=False)
    monkeypatch.undo()
    monkeypatch.setattr(surface_module, "slice_values", _never)
    monkeypatch.setattr(surface_module, "global_range", _never)
    surface_values(*mlp_loss(), SETTINGS, landscape=False)


def _never(*args, **kwargs):
    raise AssertionError("computed for a family that is off")


KILLED_MID_TRACE = """
import os, sys, time
from torch import nn
from tests.landscape.helpers import gpt_loss, params_of
from topometrics.landscape import surface
from topometrics.landscape.slice import functional_loss
from topometrics.landscape.surface import SurfaceSettings, curvature_values
from topometrics.landscape.vectors import scratch_folder
from topometrics.models.model import GPT

model, x, y, _ = gpt_loss()
single = GPT(model.cfg)
single.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
loss = functional_loss(single, lambda call: nn.functional.cross_entropy(call(x).reshape(-1, 16), y.reshape(-1)))
surface.BASIS_BYTES = 0  # "large": float32, the Lanczos and Ritz vectors in files


def link(fd):
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # the listing's own descriptor, closed by now
        return ""


def waiting(*args, **kwargs):  # the eigenpairs found, their vectors in files: wait here for the kill
    links = [link(fd) for fd in os.listdir("/proc/self/fd")]
    print(sum(link.startswith(scratch_folder()) and link.endswith("(deleted)") for link in links), flush=True)
    time.sleep(600)


surface.hessian_trace = waiting
settings = SurfaceSettings(grid=5, radius=0.5, top=3, probes=4, iters=20, seed=0, exact_max=0)
curvature_values(loss, params_of(single), settings)
"""


def test_a_large_models_curvature_killed_by_sigkill_leaves_no_file_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = scratch_folder()  # tmp_path, unless it is a memory filesystem
    before = set(os.listdir(folder))
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    child = subprocess.Popen([sys.executable, "-c", KILLED_MID_TRACE], stdout=subprocess.PIPE, text=True, env=env)
    try:
        open_files = int(child.stdout.readline())  # the child waits, its vectors' files open
    finally:
        child.kill()  # our own child, by its PID: SIGKILL, no cleanup of any kind runs
        child.wait()
    assert open_files >= 3  # the Ritz vectors' file and the two Lanczos vectors' were there, in that folder
    assert set(os.listdir(folder)) == before  # and nothing of them is left


def unnamed_files(folder: str) -> list[int]:
    """The sizes of this process's open files that have no name, in ``folder``."""
    sizes = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
            if link.startswith(folder) and link.endswith("(deleted)"):
                sizes.append(os.fstat(int(fd)).st_size)
        except OSError:  # the listing's own descriptor, closed by now
            continue
    return sizes


def large_float32_gpt(monkeypatch):
    """A tiny float32 GPT's loss and parameters, on the large model's path (float32, vectors in files)."""
    from tests.landscape.helpers import gpt_loss, params_of
    from topometrics.models.model import GPT

    model, x, y, _ = gpt_loss()
    single = GPT(model.cfg)
    single.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    loss = functional_loss(single, lambda call: nn.functional.cross_entropy(call(x).reshape(-1, 16), y.reshape(-1)))
    monkeypatch.setattr(surface_module, "BASIS_BYTES", 0)
    return loss, params_of(single)


def test_the_files_a_large_models_surface_holds_at_once_are_the_vectors_the_cost_model_counts(monkeypatch, tmp_path):
    loss, params = large_float32_gpt(monkeypatch)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a folder of this test's files alone (not pytest's)
    dim, settings, most = sum(p.numel() for p in params.values()), SETTINGS._replace(exact_max=0), []
    real = surface_module.curvature_products

    def counted_products(*args, **kwargs):
        hvp, n, dtype = real(*args, **kwargs)

        def counted(v):  # each product: the files open as it starts
            most.append(unnamed_files(scratch_folder()))
            return hvp(v)

        return counted, n, dtype

    monkeypatch.setattr(surface_module, "curvature_products", counted_products)
    landscape, curvature = surface_values(loss, params, settings)
    assert not landscape.reasons and not curvature.reasons
    spilled = surface_module.spilled_vectors(dim, settings.iters, settings.top)
    # the Ritz vectors (one file of k rows), the two Lanczos vectors, the trace's probe: that many float32 vectors
    assert spilled == max(settings.top, 2) + 3 and max(sum(files) for files in most) == 4 * dim * spilled
    assert unnamed_files(scratch_folder()) == []  # every one closed


def test_a_full_scratch_disk_gives_the_curvature_one_line_and_keeps_the_slices(tiny_disk, monkeypatch):
    loss, params = large_float32_gpt(monkeypatch)
    disk = str(tiny_disk("16k"))  # a real filesystem smaller than the vectors (6 x 5 KB)
    monkeypatch.setattr(vectors_module, "scratch_folder", lambda: disk)
    landscape, curvature = surface_values(loss, params, SETTINGS._replace(exact_max=0))
    why = f"no room left in {disk} for a file of 0.00 GB of the loss surface's vectors; point TMPDIR at a disk " \
          "with room (docs/performance.md)"  # fmt: skip
    assert set(curvature.reasons) == set(CURVATURE_KEYS) and set(curvature.reasons.values()) == {why}
    assert all(np.isnan(curvature.values[k]) for k in CURVATURE_KEYS)
    assert {landscape.reasons[k] for k in landscape.reasons if k.startswith("hess_")} == {why}
    # the random slice, and its curvature: its two directions' files fit once the Ritz vectors' were closed
    assert all(np.isfinite(v) for k, v in landscape.values.items() if k.startswith("rand_"))
    assert unnamed_files(disk) == []
