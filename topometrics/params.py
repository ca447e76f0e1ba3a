"""params.yaml -> frozen dataclasses, validated before any work starts.

Every section is a frozen dataclass; unknown keys, wrong types and impossible values
raise :class:`ParamsError` naming the key (``train.hidden``) and the fix. The whole
file is validated by every stage, so a typo stops ``dvc repro`` at its first stage.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from topometrics import params_schema as schema
from topometrics.params_schema import (
    ParamsError,
    at_least,
    build,
    check_primary_shape,
    non_negative,
    positive,
    reject_unknown,
    within,
)
from topometrics.params_sources import (
    ComputeParams,
    SeriesParams,
    TokenizerParams,
    parse_compute,
    parse_series,
    parse_tokenizer,
)

SHAPE_KEYS = ("hidden", "layers", "heads")
# keys of `train` that a recipe variant may override (the shape belongs to `ladder`)
RECIPE_KEYS = ("steps", "ckpt_every", "batch_size", "lr", "warmup", "min_lr_ratio", "weight_decay", "grad_clip")
RECIPE_KEYS += ("schedule", "decay_fraction")  # the LR schedule's shape (topometrics/models/lr_schedule.py)
BASE_VARIANT = "base"  # the recipe in `train` itself; its runs keep the short name <rung>-<seed>
# Fewest points of a cloud whose Vietoris-Rips diagram can hold a loop: the smallest cycle not filled
# by triangles is a square, so with fewer points every H1 feature is 0 by construction, not by measurement.
MIN_CLOUD_POINTS = 4
# The names of topometrics.vocabulary.FAMILIES (a test checks): params does not import the vocabulary, so
# that training, which reads params, does not depend on it.
FEATURE_FAMILIES = ("np", "vr", "spectral", "scale_free", "heavy_tail", "gradient", "representation")
FEATURE_FAMILIES += ("landscape", "curvature", "gradient_topology", "distance", "trajectory")


@dataclass(frozen=True)
class DataParams:
    corpus: str = "wikitext-2-raw-v1"  # the default download, or a local directory / UTF-8 text file
    urls: tuple[str, ...] = (
        "https://wikitext.smerity.com/wikitext-2-raw-v1.zip",
        "https://huggingface.co/datasets/ggml-org/ci/resolve/main/wikitext-2-raw-v1.zip",
    )
    download_timeout_s: float = 20.0  # per URL; then the next mirror, then the offline fallback
    seq_len: int = 128  # characters per training window = the model context
    val_fraction: float = 0.1  # tail of a single local corpus held out for validation
    val_windows: int = 256  # fixed held-out windows scored at every checkpoint
    max_unknown_share: float = 0.05  # refuse a corpus with more characters outside ASCII 0-126 (WikiText-2: 0.07%)
    tokenizer: TokenizerParams = field(default_factory=TokenizerParams)

    def check(self) -> None:
        self.tokenizer.check()
        positive(self, "data", ("seq_len", "val_windows", "download_timeout_s"))
        within(self, "data", "max_unknown_share", 0.0, 1.0, "a share of the corpus's characters")
        if not 0.0 < self.val_fraction < 1.0:
            raise ParamsError(f"data.val_fraction must be in (0, 1), got {self.val_fraction}")
        if not self.corpus:
            raise ParamsError("data.corpus is empty; use 'wikitext-2-raw-v1' or a path to local text")


@dataclass(frozen=True)
class TrainParams:
    steps: int = 5000
    ckpt_every: int = 100  # a checkpoint every this many steps, plus step 0
    batch_size: int = 64
    lr: float = 3e-3  # AdamW peak learning rate
    warmup: int = 200  # linear warm-up steps before the cosine decay
    min_lr_ratio: float = 0.0  # the cosine decays to lr * min_lr_ratio at the last step
    weight_decay: float = 0.01
    grad_clip: float = 1.0  # max global gradient 2-norm; 0 disables clipping
    schedule: str = "cosine"  # cosine | wsd (stable, then linear decay) | constant_decay (stable, then cosine tail)
    decay_fraction: float = 0.2  # share of the steps in the wsd / constant_decay tail; unused by cosine
    seeds: tuple[int, ...] = (42,)  # one run per rung x seed (stage instances train@<rung>-<seed>)
    device: str = "auto"  # auto (CUDA when present) | cpu | cuda
    threads: int = 0  # torch intra-op threads per training process; 0 = 1 (the processes fill the cores)
    workers: int = 0  # runs trained at once; 0 = one per usable core on CPU, 4 per GPU on CUDA
    monitor_every: int = 0  # weight features every this many steps while training (features.monitor); 0 = off
    monitor_surface: bool = False  # the monitor also computes landscape and curvature (features.monitor_surface)
    sketch_every: int = 10  # a JL sketch of all the weights every this many steps (training.sketch); 0 = off
    sketch_dim: int = 64  # dimensions of that sketch
    hidden: int = 48  # default shape, inherited by rungs that do not override it
    layers: int = 3
    heads: int = 4

    def check(self) -> None:
        self.check_recipe("train")
        positive(self, "train", SHAPE_KEYS)
        non_negative(self, "train", ("threads", "workers", "monitor_every", "sketch_every"))
        positive(self, "train", ("sketch_dim",))
        schema.check_seeds("train.seeds", self.seeds)
        check_device("train.device", self.device)

    def check_recipe(self, prefix: str) -> None:
        """The recipe rules alone (``prefix`` names where the values came from: train, or e.g. variants.lr_hi,
        whose values may be inherited from train, so its messages name the variant and then the key)."""
        positive(self, prefix, ("steps", "ckpt_every", "batch_size", "lr", "decay_fraction"))
        non_negative(self, prefix, ("warmup", "weight_decay", "grad_clip", "min_lr_ratio"))
        within(self, prefix, "min_lr_ratio", 0.0, 1.0, "the cosine's floor as a share of lr")
        within(self, prefix, "decay_fraction", 0.0, 1.0, "the share of the steps in the decay tail")
        if self.schedule not in ("cosine", "wsd", "constant_decay"):
            raise ParamsError(f"{prefix}.schedule must be cosine, wsd or constant_decay, got {self.schedule!r}")
        head, key = ("", "train.") if prefix == "train" else (f"{prefix}: ", "")
        if self.steps % self.ckpt_every:
            raise ParamsError(
                f"{head}{key}steps={self.steps} is not a multiple of {key}ckpt_every={self.ckpt_every}; "
                "the last step must be a checkpoint"
            )
        if self.warmup >= self.steps:
            raise ParamsError(f"{head}{key}warmup={self.warmup} must be smaller than {key}steps={self.steps}")


@dataclass(frozen=True)
class RungShape:
    hidden: int | None = None
    layers: int | None = None
    heads: int | None = None
    residual: bool = True  # False: blocks without skip connections (a rung of its own, e.g. small-noskip)


@dataclass(frozen=True)
class Variant:
    """A named recipe variant: ``train``'s recipe with these keys overridden (None = inherited)."""

    steps: int | None = None
    ckpt_every: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    warmup: int | None = None
    min_lr_ratio: float | None = None
    weight_decay: float | None = None
    grad_clip: float | None = None
    schedule: str | None = None
    decay_fraction: float | None = None

    def overrides(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


STRICTLY_POSITIVE_FEATURES = """max_points rep_points rep_dim rep_batch betti_scales workers null_draws unit_points
    landscape_radius landscape_batch landscape_every hessian_trace_rse grad_dim phdim_window phdim_alpha"""


@dataclass(frozen=True)
class FeaturesParams:
    max_points: int = 200  # weight rows per layer for Vietoris-Rips (seeded subsample)
    rep_points: int = 500  # hidden states subsampled for representation topology
    rep_dim: int = 50  # PCA dimension before Vietoris-Rips on hidden states
    rep_batch: int = 16  # validation windows whose hidden states form the cloud
    seed: int = 0  # subsampling and shuffled-null seed
    significance: float = 0.1  # a bar is significant if its persistence exceeds this fraction of the largest
    betti_scales: int = 32  # filtration scales of the Betti curve
    workers: int = 2  # processes over checkpoints
    null_draws: int = 4  # shuffled-null draws per layer behind np_excess
    unit_points: int = 64  # unit rows per layer for vr_unit_* (farthest-point subsample)
    families: tuple[str, ...] = FEATURE_FAMILIES  # those computed; the others are NULL with a reason
    landscape_grid: int = 13  # loss-slice points per axis (odd: the weights at the centre)
    landscape_radius: float = 0.1  # slice half-width, in units of the filter-normalised directions (local)
    landscape_batch: int = 4  # validation windows of the fixed loss-surface batch (landscape and curvature)
    landscape_every: int = 5  # every k-th checkpoint of a run (the first included) gets landscape and curvature
    hessian_top: int = 3  # Hessian eigenvalues kept (hess_eig1..3); Lanczos finds at least 2 (the hess directions)
    hessian_probes: int = 8  # the least Rademacher probes of a Hutchinson trace (at least 2: a standard error)
    hessian_probes_max: int = 400  # the most; probes are added until the standard error is hessian_trace_rse
    hessian_trace_rse: float = 0.05  # target standard error of an estimated trace, as a share of it
    hessian_exact_max: int = 10_000  # models with at most this many parameters get the exact trace
    hessian_iters: int = 20  # most Lanczos steps (Hessian products); it stops once the kept eigenvalues converge
    grad_batch: int = 16  # validation windows whose per-example gradients form the gradient clouds
    grad_dim: int = 64  # JL projection dimension of the whole network's gradient cloud
    phdim_window: int = 1000  # training steps of the trailing window whose iterates give traj_phdim
    phdim_sizes: tuple[int, ...] = (10, 20, 40, 80)  # subsample sizes of the PH0-dimension fit
    phdim_alpha: float = 1.0  # exponent of the H0 lifetimes; must lie below the trajectory's dimension
    device: str = "auto"  # where the families that run the model run: auto (CUDA when present) | cpu | cuda

    def check(self) -> None:
        positive(self, "features", tuple(STRICTLY_POSITIVE_FEATURES.split()))
        if unknown := [name for name in self.families if name not in FEATURE_FAMILIES]:
            raise ParamsError(f"features.families: unknown {unknown}; choose from {list(FEATURE_FAMILIES)}")
        within(self, "features", "hessian_top", 1, 3, "the vocabulary keeps hess_eig1..3")
        if len({s for s in self.phdim_sizes if s >= 8}) < 3:  # topometrics.dynamics.phdim: MIN_SIZES, MIN_SIZE
            raise ParamsError(f"features.phdim_sizes needs 3 distinct sizes >= 8, got {list(self.phdim_sizes)}")
        check_device("features.device", self.device)
        at_least(self, "features", ("landscape_grid",), 3, "a local minimum needs neighbours on both sides")
        at_least(self, "features", ("hessian_iters",), 3, "Lanczos needs more steps than the eigenvalues it keeps")
        within(self, "features", "hessian_probes", 2, self.hessian_probes_max, "a standard error needs 2 probes")
        non_negative(self, "features", ("seed", "significance", "hessian_exact_max"))
        within(self, "features", "significance", 0.0, 1.0, "a share of the longest bar's persistence")
        loop = "fewer points cannot form a loop, so every H1 feature would be 0 whatever the weights"
        at_least(self, "features", ("max_points", "rep_points", "unit_points", "grad_batch"), MIN_CLOUD_POINTS, loop)
        at_least(self, "features", ("rep_dim", "betti_scales"), 2, "a loop needs a plane, a Betti curve two scales")


@dataclass(frozen=True)
class PrimaryParams:
    """analysis.primary: the one pre-registered test (family or <= 3 of its features, fraction, scheme, level,
    baseline)."""

    family: str = ""
    fraction: float = 0.0
    cv: str = ""
    features: tuple[str, ...] = ()  # empty: the whole family (which must have <= 3 features)
    # 'recipe' (loss curve + weight norm + recipe), 'norm' (loss curve + weight norm), either + '+<geometric family>'
    baseline: str = "recipe"
    level: str = "between"  # between (which recipe/size ends better) | within (which seed of a cell ends better)
    power: float | None = None  # `bench power`'s share of 'adds' at s = 0.3 for the sweep's layout, recorded with it
    needed_runs: int | None = None  # below 80 % power: the runs `bench power --need 0.8` says would reach it


@dataclass(frozen=True)
class AnalysisParams:
    fractions: tuple[float, ...] = (0.2, 0.3, 0.5)  # share of training observed before predicting (Table 5)
    bootstrap: int = 1000  # resamples per bootstrap CI (paper section 3.3)
    seed: int = 0  # bootstrap generator seed
    alpha: float = 0.05  # family-wise level of the Bonferroni flags
    phase_threshold: float = 0.1  # diminishing returns: |dNP| below this share of its peak (Table 6)
    changepoint_penalty: float = 5.0  # PELT's cost per changepoint, in log(n) noise variances (dynamics.changepoints)
    np_patience: int = 5  # Rieck et al. NP early stopping: checkpoints without improvement
    np_min_delta: float = 0.001  # ... minimum NP increase that counts as an improvement
    loss_patience: int = 5  # validation-loss early stopping, in checkpoints
    loss_min_delta: float = 0.001  # ... minimum val-loss decrease (nats) that counts
    variant: str = "base"  # the recipe variant whose runs the scaling fits (across rungs) use
    # Feature names (topometrics.vocabulary; checked by topometrics.analysis.tables, which reads them):
    topology_features: tuple[str, ...] = ("vr_tp0", "vr_tp1")  # layer-'all' series used with NP for prediction
    weight_norm_features: tuple[str, ...] = ("w_fro",)  # weight-norm baseline: the first present
    # features whose rho(feature, val loss) goes into metrics.json (those present)
    headline_features: tuple[str, ...] = ("vr_tp0", "vr_tp1", "np_norm", "rep_tp0", "w_spec", "w_rankme")
    permutations: int = 99  # cell-block refits behind each verdict p-value (smallest p: 1 / (1 + this))
    min_effect: float = 0.01  # 'adds' needs a gain of at least this share of the baseline MAE
    equivalence_margin: float = 0.05  # 'ruled out' when the 95% bound on the gain is within this share
    primary: PrimaryParams | None = None  # the pre-registered endpoint (None: every row exploratory)
    loss_unit: str = "nats"  # nats (per token) | bpb (bits per UTF-8 byte): the unit final losses are compared in
    outlier_sd: float = 5.0  # an outlier run: final loss > this many robust SDs above its cell's other seeds
    outlier_min_gain: float = 0.05  # the outlier row's 'adds' needs an AUROC gain of at least this

    def check(self) -> None:
        names = ("bootstrap", "np_patience", "loss_patience", "alpha", "phase_threshold", "changepoint_penalty")
        positive(self, "analysis", (*names, "outlier_sd"))
        non_negative(self, "analysis", ("seed", "np_min_delta", "loss_min_delta", "min_effect", "permutations"))
        within(self, "analysis", "equivalence_margin", 0.0, 1.0, "a share of the baseline MAE")
        within(self, "analysis", "outlier_min_gain", 0.0, 1.0, "an AUROC gain")
        within(self, "analysis", "alpha", 0.0, 1.0, "a significance level")
        within(self, "analysis", "phase_threshold", 0.0, 1.0, "a share of the NP change's peak")
        if not self.fractions or not all(0.0 < f < 1.0 for f in self.fractions):
            raise ParamsError(f"analysis.fractions must be shares in (0, 1), got {list(self.fractions)}")
        if self.loss_unit not in ("nats", "bpb"):
            raise ParamsError(f"analysis.loss_unit must be nats or bpb (bits per byte), got {self.loss_unit!r}")

    def settings(self) -> ViewSettings:
        """The subset the SQL views read from the warehouse's ``settings`` table."""
        return ViewSettings(**{f.name: getattr(self, f.name) for f in fields(ViewSettings)})


@dataclass(frozen=True)
class ViewSettings:
    """The analysis params the SQL views read from the warehouse's ``settings`` table (one row)."""

    phase_threshold: float
    np_patience: int
    np_min_delta: float
    loss_patience: int
    loss_min_delta: float
    alpha: float = 0.05
    loss_unit: str = "nats"  # the unit the final loss is compared in (final_checkpoints.loss)


@dataclass(frozen=True)
class Params:
    data: DataParams = field(default_factory=DataParams)
    train: TrainParams = field(default_factory=TrainParams)
    ladder: dict[str, RungShape] = field(default_factory=dict)
    features: FeaturesParams = field(default_factory=FeaturesParams)
    analysis: AnalysisParams = field(default_factory=AnalysisParams)
    series: SeriesParams = field(default_factory=SeriesParams)
    compute: ComputeParams = field(default_factory=ComputeParams)
    variants: dict[str, Variant] = field(default_factory=dict)

    def runs(self) -> list[tuple[str, str, int]]:
        """Every training run params.yaml declares, as (rung, variant, seed): ladder x variants x seeds.
        The base variant (``train``'s own recipe) comes first, then ``variants`` in file order."""
        variants = [BASE_VARIANT, *self.variants]
        return [(rung, v, seed) for v in variants for rung in self.ladder for seed in self.train.seeds]

    def run_names(self, variant: str | None = None) -> list[str]:
        """The names of :meth:`runs` (see :func:`run_name`), of one ``variant`` if given: run directories
        and config files."""
        return [run_name(r, s, v) for r, v, s in self.runs() if variant is None or v == variant]

    def recipe(self, variant: str = BASE_VARIANT) -> TrainParams:
        """``train`` with the overrides of ``variants.<variant>`` (``base``: ``train`` itself)."""
        if variant == BASE_VARIANT:
            return self.train
        if variant not in self.variants:
            raise ParamsError(f"variants.{variant} does not exist; variants are {[BASE_VARIANT, *self.variants]}")
        return dataclasses.replace(self.train, **self.variants[variant].overrides())

    def rung_shape(self, rung: str) -> dict[str, int | bool]:
        """``train``'s shape with ``ladder.<rung>``'s overrides: the inheritance rule; ``residual: False``
        only when the rung says so (a default model's config, and so its checkpoints, stay as they were)."""
        if rung not in self.ladder:
            raise ParamsError(f"ladder.{rung} does not exist; rungs are {sorted(self.ladder)}")
        shape = self.ladder[rung]
        merged = {k: getattr(shape, k) if getattr(shape, k) is not None else getattr(self.train, k) for k in SHAPE_KEYS}
        if merged["hidden"] % merged["heads"]:
            raise ParamsError(
                f"ladder.{rung}: hidden={merged['hidden']} is not divisible by heads={merged['heads']}; "
                f"set ladder.{rung}.heads to a divisor of hidden"
            )
        return merged if shape.residual else merged | {"residual": False}


def run_name(rung: str, seed: int, variant: str = BASE_VARIANT) -> str:
    """Name of one training run (data/runs/<name>, data/config/<name>.json, features@<name>):
    ``<rung>-<seed>`` for the base variant, as DVC's matrix over ladder x train.seeds keys it;
    ``<rung>-<variant>-<seed>`` for the others (the key of the matrix over ladder x variants x seeds)."""
    return f"{rung}-{seed}" if variant == BASE_VARIANT else f"{rung}-{variant}-{seed}"


def load_params(path: str | Path = "params.yaml") -> Params:
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path} not found; run from the repository root")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise ParamsError(f"{path}{line} is not valid YAML: {getattr(err, 'problem', err)}; fix the syntax") from err
    return parse_params(raw)


def parse_params(raw: dict) -> Params:
    """Validate a params mapping (as in params.yaml) into :class:`Params`."""
    if not isinstance(raw, dict):
        raise ParamsError("params.yaml must be a mapping of sections")
    reject_unknown(raw, Params, "")
    ladder_raw = raw.get("ladder", {}) or {}
    if not isinstance(ladder_raw, dict) or not ladder_raw:
        raise ParamsError("ladder must map rung names to shape overrides, e.g. tiny: {hidden: 8}")
    ladder = {}
    for rung, shape in ladder_raw.items():
        schema.check_name("ladder", rung, "-_", "tiny")
        ladder[rung] = build(RungShape, shape or {}, f"ladder.{rung}")
        positive(ladder[rung], f"ladder.{rung}", SHAPE_KEYS)
    data = raw.get("data") or {}
    data = data | {"tokenizer": parse_tokenizer(data)} if isinstance(data, dict) else data
    params = Params(
        data=build(DataParams, data, "data"),
        train=build(TrainParams, raw.get("train") or {}, "train"),
        ladder=ladder,
        features=build(FeaturesParams, raw.get("features") or {}, "features"),
        analysis=_parse_analysis(raw.get("analysis") or {}),
        series=parse_series(raw.get("series") or {}),
        compute=parse_compute(raw.get("compute") or {}),
        variants=_parse_variants(raw.get("variants") or {}),
    )
    for section in (params.data, params.train, params.features, params.analysis, params.series, params.compute):
        section.check()
    for rung in ladder:
        params.rung_shape(rung)
    for name in params.variants:
        params.recipe(name).check_recipe(f"variants.{name}")
    if params.analysis.variant != BASE_VARIANT and params.analysis.variant not in params.variants:
        raise ParamsError(
            f"analysis.variant={params.analysis.variant!r} is not a declared variant; "
            f"use one of {[BASE_VARIANT, *params.variants]}"
        )
    _check_primary(params)
    schema.check_run_names(params.run_names(), list(ladder), list(params.series.sources))
    return params


def _parse_analysis(raw: object) -> AnalysisParams:
    raw = dict(raw) if isinstance(raw, dict) else raw
    primary = raw.pop("primary", None) if isinstance(raw, dict) else None
    analysis = build(AnalysisParams, raw, "analysis")
    primary = None if primary is None else build(PrimaryParams, primary, "analysis.primary")
    return dataclasses.replace(analysis, primary=primary)


def _check_primary(params: Params) -> None:
    """The primary endpoint's shape against the declared runs (its names against the vocabulary are
    topometrics.verdict.verdict.check_primary's: training must not depend on it)."""
    if params.analysis.primary is not None:
        groups = {"seed": len(params.train.seeds), "variant": 1 + len(params.variants), "rung": len(params.ladder)}
        check_primary_shape(params.analysis.primary, groups, params.analysis.fractions, params.analysis.alpha)


def _parse_variants(raw: object) -> dict[str, Variant]:
    """``variants``: name -> overrides of train's recipe keys; the shape and run-level keys are refused."""
    if not isinstance(raw, dict):
        raise ParamsError(
            f"variants must map variant names to recipe overrides, e.g. lr_hi: {{lr: 0.006}}; got {raw!r}"
        )
    variants = {}
    for name, overrides in raw.items():
        schema.check_name("variants", name, "_", "lr_hi")
        if name == BASE_VARIANT:
            raise ParamsError(
                f"variants.{BASE_VARIANT}: '{BASE_VARIANT}' is the recipe in train itself; "
                "change train.<key> or give this variant another name"
            )
        overrides = overrides or {}
        if not isinstance(overrides, dict):
            raise ParamsError(f"variants.{name} must map recipe keys to values, e.g. {{lr: 0.006}}; got {overrides!r}")
        for key in overrides:
            if key in SHAPE_KEYS:
                raise ParamsError(
                    f"variants.{name}.{key}: the model shape belongs in ladder, not in a recipe variant; "
                    f"add a rung, e.g. ladder.{name}: {{{key}: ...}}"
                )
            if key not in RECIPE_KEYS and key in {f.name for f in fields(TrainParams)}:
                raise ParamsError(
                    f"variants.{name}.{key}: train.{key} applies to every run, not a recipe variant; "
                    f"variants may set {', '.join(RECIPE_KEYS)}"
                )
            if key not in RECIPE_KEYS:
                raise ParamsError(f"unknown param variants.{name}.{key}; variants may set {', '.join(RECIPE_KEYS)}")
        variants[name] = build(Variant, overrides, f"variants.{name}")
    return variants


def check_device(key: str, device: str) -> None:
    """A device setting (``train.device``, ``features.device``) is auto, cpu or cuda, and cuda only where one is."""
    if device not in ("auto", "cpu", "cuda"):
        raise ParamsError(f"{key} must be auto, cpu or cuda, got {device!r}")
    if device == "cuda" and not _cuda_available():
        raise ParamsError(f"{key} is cuda but no CUDA device is visible; set {key}: auto or cpu")


def _cuda_available() -> bool:
    import torch  # only when CUDA is asked for: params are read by every stage, most never need torch

    return torch.cuda.is_available()


def as_dict(obj: object) -> dict:
    return dataclasses.asdict(obj)
