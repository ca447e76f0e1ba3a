"""params.yaml -> frozen dataclasses, validated before any work starts.

Every section is a frozen dataclass; unknown keys, wrong types and impossible values
raise :class:`ParamsError` naming the key (``train.hidden``) and the fix. The whole
file is validated by every stage, so a typo stops ``dvc repro`` at its first stage.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from importlib import resources
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
from topometrics.params_variants import BASE_VARIANT, SHAPE_KEYS, Variant, parse_variants

# Fewest points of a cloud whose Vietoris-Rips diagram can hold a loop: the smallest cycle not filled
# by triangles is a square, so with fewer points every H1 feature is 0 by construction, not by measurement.
MIN_CLOUD_POINTS = 4
# The names of topometrics.vocabulary.FAMILIES (a test checks): params does not import the vocabulary, so
# that training, which reads params, does not depend on it.
FEATURE_FAMILIES = ("np", "vr", "spectral", "scale_free", "heavy_tail", "gradient", "representation")
FEATURE_FAMILIES += ("landscape", "curvature", "gradient_topology", "distance", "trajectory")


@dataclass(frozen=True, kw_only=True)
class DataParams:
    corpus: str  # the default download, or a local directory / UTF-8 text file
    urls: tuple[str, ...]
    download_timeout_s: float  # per URL; then the next mirror, then the offline fallback
    seq_len: int  # characters per training window = the model context
    val_fraction: float  # tail of a single local corpus held out for validation
    val_windows: int  # fixed held-out windows scored at every checkpoint
    max_unknown_share: float  # refuse a corpus with more characters outside ASCII 0-126 (WikiText-2: 0.07%)
    tokenizer: TokenizerParams

    def check(self) -> None:
        self.tokenizer.check()
        positive(self, "data", ("seq_len", "val_windows", "download_timeout_s"))
        within(self, "data", "max_unknown_share", 0.0, 1.0, "a share of the corpus's characters")
        if not 0.0 < self.val_fraction < 1.0:
            raise ParamsError(f"data.val_fraction must be in (0, 1), got {self.val_fraction}")
        if not self.corpus:
            raise ParamsError("data.corpus is empty; use 'wikitext-2-raw-v1' or a path to local text")


@dataclass(frozen=True, kw_only=True)
class TrainParams:
    steps: int
    ckpt_every: int  # a checkpoint every this many steps, plus step 0
    batch_size: int
    lr: float  # AdamW peak learning rate
    warmup: int  # linear warm-up steps before the cosine decay
    min_lr_ratio: float  # the cosine decays to lr * min_lr_ratio at the last step
    weight_decay: float
    grad_clip: float  # max global gradient 2-norm; 0 disables clipping
    schedule: str = "cosine"  # cosine | wsd (stable, then linear decay) | constant_decay (stable, then cosine tail)
    decay_fraction: float = 0.2  # share of the steps in the wsd / constant_decay tail; unused by cosine
    seeds: tuple[int, ...]  # one run per rung x seed (stage instances train@<rung>-<seed>)
    device: str  # auto (CUDA when present) | cpu | cuda
    threads: int  # torch intra-op threads per training process; 0 = 1 (the processes fill the cores)
    workers: int  # runs trained at once; 0 = one per usable core on CPU, 4 per GPU on CUDA
    monitor_every: int  # weight features every this many steps while training (features.monitor); 0 = off
    monitor_surface: bool  # the monitor also computes landscape and curvature (features.monitor_surface)
    sketch_every: int  # a JL sketch of all the weights every this many steps (training.sketch); 0 = off
    sketch_dim: int  # dimensions of that sketch
    hidden: int  # default shape, inherited by rungs that do not override it
    layers: int
    heads: int

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


STRICTLY_POSITIVE_FEATURES = """max_points rep_points rep_dim rep_batch betti_scales workers null_draws unit_points
    landscape_radius landscape_batch landscape_every hessian_trace_rse grad_dim phdim_window phdim_alpha"""


@dataclass(frozen=True, kw_only=True)
class FeaturesParams:
    max_points: int  # weight rows per layer for Vietoris-Rips (seeded subsample)
    rep_points: int  # hidden states subsampled for representation topology
    rep_dim: int  # PCA dimension before Vietoris-Rips on hidden states
    rep_batch: int  # validation windows whose hidden states form the cloud
    seed: int  # subsampling and shuffled-null seed
    significance: float  # a bar is significant if its persistence exceeds this fraction of the largest
    betti_scales: int  # filtration scales of the Betti curve
    workers: int  # processes over checkpoints
    null_draws: int  # shuffled-null draws per layer behind np_excess
    unit_points: int  # unit rows per layer for vr_unit_* (farthest-point subsample)
    families: tuple[str, ...]  # those computed; the others are NULL with a reason
    landscape_grid: int  # loss-slice points per axis (odd: the weights at the centre)
    landscape_radius: float  # slice half-width, in units of the filter-normalised directions (local)
    landscape_batch: int  # validation windows of the fixed loss-surface batch (landscape and curvature)
    landscape_every: int  # every k-th checkpoint of a run (the first included) gets landscape and curvature
    hessian_top: int  # Hessian eigenvalues kept (hess_eig1..3); Lanczos finds at least 2 (the hess directions)
    hessian_probes: int  # the least Rademacher probes of a Hutchinson trace (at least 2: a standard error)
    hessian_probes_max: int  # the most; probes are added until the standard error is hessian_trace_rse
    hessian_trace_rse: float  # target standard error of an estimated trace, as a share of it
    hessian_exact_max: int  # models with at most this many parameters get the exact trace
    hessian_iters: int  # most Lanczos steps (Hessian products); it stops once the kept eigenvalues converge
    grad_batch: int  # validation windows whose per-example gradients form the gradient clouds
    grad_dim: int  # JL projection dimension of the whole network's gradient cloud
    phdim_window: int  # training steps of the trailing window whose iterates give traj_phdim
    phdim_sizes: tuple[int, ...]  # subsample sizes of the PH0-dimension fit
    phdim_alpha: float  # exponent of the H0 lifetimes; must lie below the trajectory's dimension
    device: str  # where the families that run the model run: auto (CUDA when present) | cpu | cuda

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


@dataclass(frozen=True, kw_only=True)
class AnalysisParams:
    fractions: tuple[float, ...]  # share of training observed before predicting (Table 5)
    bootstrap: int  # resamples per bootstrap CI (paper section 3.3)
    seed: int  # bootstrap generator seed
    alpha: float  # family-wise level of the Bonferroni flags
    phase_threshold: float  # diminishing returns: |dNP| below this share of its peak (Table 6)
    changepoint_penalty: float  # PELT's cost per changepoint, in log(n) noise variances (dynamics.changepoints)
    np_patience: int  # Rieck et al. NP early stopping: checkpoints without improvement
    np_min_delta: float  # ... minimum NP increase that counts as an improvement
    loss_patience: int  # validation-loss early stopping, in checkpoints
    loss_min_delta: float  # ... minimum val-loss decrease (nats) that counts
    variant: str = "base"  # the recipe variant whose runs the scaling fits (across rungs) use
    # Feature names (topometrics.vocabulary; checked by topometrics.analysis.tables, which reads them):
    topology_features: tuple[str, ...]  # layer-'all' series used with NP for prediction
    weight_norm_features: tuple[str, ...]  # weight-norm baseline: the first present
    # features whose rho(feature, val loss) goes into metrics.json (those present)
    headline_features: tuple[str, ...]
    permutations: int  # cell-block refits behind each verdict p-value (smallest p: 1 / (1 + this))
    min_effect: float  # 'adds' needs a gain of at least this share of the baseline MAE
    equivalence_margin: float  # 'ruled out' when the 95% bound on the gain is within this share
    primary: PrimaryParams | None = None  # the pre-registered endpoint (None: every row exploratory)
    loss_unit: str  # nats (per token) | bpb (bits per UTF-8 byte): the unit final losses are compared in
    outlier_sd: float  # an outlier run: final loss > this many robust SDs above its cell's other seeds
    outlier_min_gain: float  # the outlier row's 'adds' needs an AUROC gain of at least this

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


@dataclass(frozen=True, kw_only=True)
class ViewSettings:
    """The analysis params the SQL views read from the warehouse's ``settings`` table (one row)."""

    phase_threshold: float
    np_patience: int
    np_min_delta: float
    loss_patience: int
    loss_min_delta: float
    alpha: float
    loss_unit: str  # the unit the final loss is compared in (final_checkpoints.loss)


@dataclass(frozen=True, kw_only=True)
class Params:
    data: DataParams
    train: TrainParams
    ladder: dict[str, RungShape]
    features: FeaturesParams
    analysis: AnalysisParams
    series: SeriesParams
    compute: ComputeParams
    variants: dict[str, Variant] = field(default_factory=dict)  # optional: no variants, only train's recipe

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


def project_params() -> Params:
    """The project's own params.yaml, installed with the package (``topometrics/params.yaml`` links to the one at
    the repository's root, so it is the same file, not a copy): the values ``features_of`` and
    ``TopologyMonitor`` use when a caller outside a project passes none."""
    return load_params(resources.files("topometrics").joinpath("params.yaml"))


def parse_params(raw: dict) -> Params:
    """Validate a params mapping (as in params.yaml) into :class:`Params`."""
    if not isinstance(raw, dict):
        raise ParamsError("params.yaml must be a mapping of sections")
    reject_unknown(raw, Params, "")
    if absent := [section for section in schema.required(Params) if section not in raw]:
        raise schema.missing(absent[0])  # every section but variants (none: only train's recipe)
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
        variants=parse_variants(raw.get("variants") or {}, {f.name for f in fields(TrainParams)}),
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
