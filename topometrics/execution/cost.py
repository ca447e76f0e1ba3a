"""What one checkpoint's features cost, told before they run: seconds (one thread) and peak memory per family.

Everything scales with the parameter count ``n`` of the model (a Pythia-shaped GPT-NeoX from 70M to 410M
parameters: the per-layer work, the gradients and the Hessian-vector products are all linear in ``n`` at
a fixed batch). :data:`SECONDS_PER_MILLION` and :data:`BYTES_PER_PARAMETER` are the rates;
:func:`checkpoint_costs` applies them, :func:`unaffordable` names the families a machine's available memory
cannot hold (each with the GB it needs), :func:`plan_line` is the one line a stage prints before it starts.

Provenance. Seconds: one-thread CPU seconds of each family alone on one random-init checkpoint of our GPT at the
Pythia block shapes (our 128-character vocabulary; ``python -m bench features --models
pythia-70m-shaped,pythia-160m-shaped,pythia-410m-shaped``, docs/performance.md, "Every family at the Pythia
shapes"), divided by the parameters in millions, at the largest shape measured: 410M (302.6M parameters) for the
weight, gradient, gradient-cloud, trajectory and landscape families (the landscape's was 7.5 s per million at 160M,
8.3 at 410M). The weight families' rate is the earlier measurement on a Pythia-160M-shaped GPT-NeoX (vocabulary
50,304; 162.3M parameters), which the five measured alone at 410M confirm (0.15 s per million without
``heavy_tail``'s forward pass). The curvature's is from its exact float32 products on the 410M shape (below),
counted at the most Lanczos products (two passes) and the trace's 3 deflation products — at the least probes, as on
a trained checkpoint: the adaptive trace may take up to ``features.hessian_probes_max`` (random inits took 3.3x this
estimate at the 70M shape and 5.0x at the 160M shape: 4,882 s), and the exact trace (at most
``features.hessian_exact_max`` parameters) one product per parameter, which is not linear in ``n``. Memory: bytes
held per parameter, counted from the buffers each family keeps (float32 weights 4 B, a float64 copy 8 B), checked
against the bench's measured peaks above ``FIXED_BYTES`` (410M: 6.0 B per parameter for the weight families and the
trajectory, 17.4 for a forward and backward pass, 18.9 for the gradient clouds, 19.2 for the landscape) and the
curvature's on the 410M shape (5,944 MiB: 17.0 B per parameter with the model, its vectors in files; 7,542 MiB
before; it was 16 GB at 70M and 36-38 GB at 160M with a kept float64 Lanczos basis and float64 products; ``python -m
bench curvature``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from dataclasses import dataclass

GIB = 1 << 30
# One-thread seconds per million parameters (measured; see the module docstring).
SECONDS_PER_MILLION = {
    "weights": 26.4 / 162.3,  # np, vr, spectral, scale_free, heavy_tail together (layer_features)
    "trajectory": 7.0 / 302.6,  # the sparse projection of the iterate and the two fits
    "gradient": 47.4 / 302.6,  # one forward+backward of 16 x 128 tokens
    "gradient_topology": 86.9 / 302.6,  # its own forward+backward with the per-example clouds
    "landscape": 2518.1 / 302.6,  # the slices' 338 loss evaluations and the top eigenpairs they follow (410M shape)
    # <= 20 Lanczos steps (two passes: <= 39 products) + 3 deflation products + 8 probes: 50 exact float32 products
    # one window at a time (landscape/slice.py's exact_hvp, the path of every model this estimate serves): 3,483 s
    # of one thread on the 410M shape (302.6M parameters, a random init, all 20 steps; ~70 s a product at load
    # 2-4, ~1.8x the float64 difference product it replaced); at the least probes (features.hessian_probes): each
    # more adds one product
    "curvature": 3482.7 / 302.6,
}
# Peak bytes per parameter: the model and what each family keeps besides it (counted; see the docstring).
BYTES_PER_PARAMETER = {
    "weights": 4 + 4,  # the model, one layer's float64 copy at most (streamed layers: far less)
    "trajectory": 4 + 8,  # the weights and their float64 flattening
    "gradient": 4 + 4 + 10,  # the model, its gradients, activations (16 x 128 tokens: measured 17.4 B in all)
    "gradient_topology": 4 + 4 + 8 + 8,  # as gradient, and the whole-network sketch's float64 flattening
    # the model, the exact product's result (its vector waits in a file) and the double backward's own working set
    # (2.24 vectors at the 410M shape, 3.08 at 70M: tools/product_memory.py; 12 B); the grids' phase (two directions,
    # a moved copy, activations) holds less. Measured: 6,563 MiB on the 410M shape, 19.2 B per parameter over
    # FIXED_BYTES
    "landscape": 4 + 4 + 12,
    # the model, the exact product's result (the Lanczos vectors, the Ritz vectors and the trace's probes wait in
    # files: landscape/curvature.py, trace.py) and the double backward's own working set, as the landscape's.
    # Measured: 5,944 MiB peak on the 410M shape, 17.0 B per parameter over FIXED_BYTES (7,542 MiB, 22.6 B, when
    # the Lanczos vectors were held through the products)
    "curvature": 4 + 4 + 12,
}
FIXED_BYTES = 1 * GIB  # the interpreter, torch, transformers, the tokenizer
GROUP = {name: "weights" for name in ("np", "vr", "spectral", "scale_free", "heavy_tail")}
# The rated families that run the model, on ``features.device`` (the others read weights on the CPU).
MODEL_RUNNING = ("gradient", "gradient_topology", "landscape", "curvature")
SURFACE = ("landscape", "curvature")  # the families of the loss surface, on its checkpoints only


# The curvature rate's products (see SECONDS_PER_MILLION): two Lanczos passes and the deflation's, then one a probe.
CURVATURE_FIXED_PRODUCTS, RATED_PROBES = 42, 8


@dataclass(frozen=True)
class FamilyCost:
    family: str  # a rate's key ("weights" stands for the five weight families)
    seconds: float  # one thread, one checkpoint
    peak_bytes: int  # the process's peak while it runs
    seconds_max: float | None = None  # the most it can take (the curvature's trace at its most probes), if more
    scratch_bytes: int = 0  # disk its vectors take in files at once (a large model's loss surface), if any


def checkpoint_costs(
    parameters: int,
    families: Iterable[str],
    surface: bool = True,
    probes: tuple[int, int] | None = None,
    spilled: int = 0,
) -> list[FamilyCost]:
    """The cost of each rated family among ``families`` for one checkpoint of ``parameters`` parameters.

    ``surface`` False leaves out landscape and curvature (a checkpoint off ``features.landscape_every``).
    Families without a rate (representation, distance: one forward pass, or distances of kept iterates)
    are not listed. ``probes``: ``features.hessian_probes`` and ``hessian_probes_max``; the curvature then costs
    its products at the least probes (a trained checkpoint's trace stops there) and, as ``seconds_max``, at
    the most (a random initialisation's can take them all), at the rate's cost per product. ``spilled``: the
    float32 vectors of the model's size the loss surface keeps in files at once
    (``landscape.surface.spilled_vectors``; 0 for a model whose vectors stay in memory), its ``scratch_bytes``."""
    keys = dict.fromkeys(GROUP.get(f, f) for f in families)
    keys = [k for k in keys if k in SECONDS_PER_MILLION and (surface or k not in SURFACE)]
    costs = [
        FamilyCost(
            k,
            SECONDS_PER_MILLION[k] * parameters / 1e6,
            FIXED_BYTES + BYTES_PER_PARAMETER[k] * parameters,
            scratch_bytes=4 * spilled * parameters if k in SURFACE else 0,
        )
        for k in keys
    ]
    if probes is None:
        return costs
    product = SECONDS_PER_MILLION["curvature"] * parameters / 1e6 / (CURVATURE_FIXED_PRODUCTS + RATED_PROBES)
    least, most = ((CURVATURE_FIXED_PRODUCTS + n) * product for n in probes)
    return [dataclasses.replace(c, seconds=least, seconds_max=most) if c.family == "curvature" else c for c in costs]


def available_bytes() -> int:
    """The memory the machine can give now without swapping: ``MemAvailable`` of /proc/meminfo (else all RAM)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def unaffordable(
    costs: list[FamilyCost],
    available: int,
    gpu_available: int | None = None,
    scratch: tuple[str, int] | None = None,
) -> dict[str, str]:
    """Family key -> why it is skipped: what it adds to the running process (its peak less :data:`FIXED_BYTES`,
    already resident) exceeds ``available`` bytes of host memory (one line, with the GB); or, with ``scratch``
    (the folder its vectors' files go to and the bytes free there, ``landscape.vectors.scratch_space``), its
    files exceed them.

    ``gpu_available``: the free bytes of the GPU the model-running families (:data:`MODEL_RUNNING`) run on. Each
    of them must then fit there too: the model, its working set and the products' vectors on the GPU are bounded
    by the same estimate, and the host keeps its check (the loaded checkpoint, the Lanczos vectors, the drawn
    directions and the spilled ones stay there). No GPU rate is measured: the bytes are the CPU's."""
    too_big = {
        c.family: f"needs ~{c.peak_bytes / GIB:.1f} GB at peak, {available / GIB:.1f} GB available (estimated)"
        for c in costs
        if c.peak_bytes - FIXED_BYTES > available
    }
    if scratch is not None:
        folder, free = scratch
        too_big |= {
            c.family: f"needs ~{c.scratch_bytes / GIB:.1f} GB of disk for its vectors in {folder}, "
            f"{free / GIB:.1f} GB free there (TMPDIR names the folder)"
            for c in costs
            if c.family not in too_big and c.scratch_bytes > free
        }
    if gpu_available is None:
        return too_big
    on_gpu = {
        c.family: f"needs ~{(c.peak_bytes - FIXED_BYTES) / GIB:.1f} GB of GPU memory, {gpu_available / GIB:.1f} GB "
        "free on the GPU (estimated)"
        for c in costs
        if c.family in MODEL_RUNNING and c.family not in too_big and c.peak_bytes - FIXED_BYTES > gpu_available
    }
    return too_big | on_gpu


def skipped_families(families: Iterable[str], too_big: dict[str, str]) -> tuple[str, ...]:
    """The ``features.families`` names a set of unaffordable rate keys covers (the weight group by its members)."""
    return tuple(f for f in families if GROUP.get(f, f) in too_big)


def plan_line(
    parameters: int, costs: list[FamilyCost], checkpoints: int = 1, surface_every: int = 1, device: str = "cpu"
) -> str:
    """One line: the model's size, each family's seconds and peak GB, and the total for ``checkpoints``, of which
    every ``surface_every``-th from the first has the loss surface (``features.landscape_every``).

    ``device``: where the families that run the model run (``features.device`` resolved). On ``cuda`` the line
    says that its seconds are the CPU's rates: no GPU rate has been measured, so it claims none."""
    parts = ", ".join(
        f"{c.family} {c.seconds:.0f} s"
        + (f" (up to {c.seconds_max:.0f} s at a random init)" if c.seconds_max else "")
        + f" / {c.peak_bytes / GIB:.1f} GB"
        + (f" + {c.scratch_bytes / GIB:.1f} GB of disk" if c.scratch_bytes else "")
        for c in costs
    )
    surfaced = -(-checkpoints // surface_every)

    def total_of(seconds) -> float:
        return sum(seconds(c) * (surfaced if c.family in SURFACE else checkpoints) for c in costs)

    total, most = total_of(lambda c: c.seconds), total_of(lambda c: c.seconds_max or c.seconds)
    upto = f" (up to ~{most / 3600:.2f} h if every trace takes its most probes)" if most > total else ""
    peak = max((c.peak_bytes for c in costs), default=FIXED_BYTES)
    on_gpu = [c.family for c in costs if c.family in MODEL_RUNNING]
    caveat = (
        f" ({', '.join(on_gpu)} will run on cuda: these are one CPU thread's rates, no GPU rate is measured yet)"
        if device == "cuda" and on_gpu
        else ""
    )
    return (
        f"estimate for {parameters / 1e6:.1f}M parameters (one thread, per checkpoint): {parts}; "
        f"{checkpoints} checkpoint(s): ~{total / 3600:.2f} h{upto}, peak ~{peak / GIB:.1f} GB{caveat}"
    )


def one_layer_line(largest_elements: int, available: int) -> str | None:
    """Why a checkpoint cannot be measured at all (its largest tensor, stored and as float64, exceeds
    ``available`` bytes), or None."""
    need = 12 * largest_elements  # the tensor as stored (float32 at most) and its float64 copy
    if need <= available:
        return None
    return f"its largest tensor needs ~{need / GIB:.1f} GB to read, {available / GIB:.1f} GB available"
