"""The feature vocabulary: every feature's name, definition, family and layer aggregation, declared once.

Computing modules compute values under these names; the features tables, the analysis
(:func:`kind`), the SQL views, ``params.yaml``'s feature lists and the report read them from here.
``docs/features.md`` documents the same table in prose (a test checks that every name is there).

A feature is computed either for every linear layer (``aggregate`` says how the per-layer values
become the ``layer='all'`` value) or once per checkpoint (``aggregate = MODEL``: a ``layer='all'``
row only). Aggregations:

``mean_std``  the mean over layers, plus ``<name>_std``, the population standard deviation (ddof 0)
``mean``      the mean over layers
``sum``       the sum over layers
``max``       the largest value over layers
``norm``      the 2-norm over layers, ``sqrt(sum v^2)`` (a global Frobenius norm)
``mean_finite`` the mean over the layers with a value (NULL when no layer has one)

``kind`` is what the analysis compares: ``topological`` features (persistence, saddles, Betti-type counts)
against ``spectral`` ones (Steiger's test); ``geometric`` features (the loss surface's curvature, a loss
slice's range and basin share) are a baseline the verdict adds to the loss curve, weight norm and recipe,
never a topological row; ``other`` features are not compared. A family mixing kinds is a context row.

``input`` is what a feature is computed from, and so which features are NULL together when that
input is unusable (:func:`computed_from`): ``weights`` (the linear layers), ``forward`` (the fixed
batch's forward and backward pass: gradients, loss), ``states`` (its hidden states), ``previous``
(the run's earlier checkpoints: the previous one's diagrams, the iterates of a trailing window), ``run``
(the run's series of other features up to a cutoff, summarised by the analysis at each ``analysis.fractions``
point: never a row of the features tables, and so in no family the features stage computes).

``verdict`` names the family of inputs a family's features join in the between-run verdict
(:mod:`topometrics.verdict.verdict`, :func:`verdict_families`); ``None`` leaves them out, and so does a
feature's ``in_verdict = False``.

To add a measure: compute it in its module (a pure function of arrays), add a :class:`Feature`
to :data:`FEATURES` (in a new :class:`Family` added to :data:`FAMILIES` if it is computed by a new
function), emit it where that family is computed (``topometrics.features.checkpoint``), and add a row to
``docs/features.md``.

Why over 400 lines: it is a table, not logic: every feature's name, family, definition and aggregation,
declared once (most lines are :class:`Feature` rows); splitting it would make two places to look a name up.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

MODEL = "model"  # aggregate of a feature computed once per checkpoint (layer 'all' only)
AGGREGATIONS = ("mean_std", "mean", "sum", "max", "norm", "mean_finite", MODEL)
KINDS = ("topological", "spectral", "geometric", "other")
WEIGHTS, FORWARD, STATES, PREVIOUS, RUN = INPUTS = ("weights", "forward", "states", "previous", "run")
ALL = "all"  # the layer of model-level rows


@dataclass(frozen=True)
class Family:
    """Features computed together by one function, which returns them in the order of :data:`FEATURES`."""

    name: str
    kind: str  # one of KINDS
    prefix: str  # the computing function's keys + prefix = the feature names
    input: str  # one of INPUTS
    verdict: str | None = None  # the verdict's family of these features (None: not in the verdict)

    def __post_init__(self) -> None:
        _check(self.name, kind=(self.kind, KINDS), input=(self.input, INPUTS))

    @property
    def features(self) -> tuple[Feature, ...]:
        return tuple(feature for feature in FEATURES if feature.family == self)


@dataclass(frozen=True)
class Feature:
    """One feature: its name in the ``feature`` column, its family, how it reaches ``layer='all'``, what it means."""

    name: str
    family: Family
    aggregate: str  # one of AGGREGATIONS
    definition: str
    kind: str | None = None  # overrides the family's kind
    per_scale: bool = False  # a curve: one feature per filtration scale, named <name>_00 ... (features.betti_scales)
    input: str | None = None  # overrides the family's input
    in_verdict: bool = True  # False: left out of the family's verdict inputs

    def __post_init__(self) -> None:
        _check(self.name, aggregate=(self.aggregate, AGGREGATIONS), kind=(self.kind or KINDS[0], KINDS))
        _check(self.name, input=(self.input or INPUTS[0], INPUTS))


def _check(name: str, **fields: tuple[str, tuple[str, ...]]) -> None:
    """A declaration with a value outside its field's choices fails at import, naming it."""
    for field, (value, choices) in fields.items():
        if value not in choices:
            raise ValueError(f"{name}: {field} {value!r} is not one of {choices}")


NP = Family("np", "topological", "np_", WEIGHTS, verdict="weights_np")
VR = Family("vr", "topological", "vr_", WEIGHTS, verdict="weights_vr")
SPECTRAL = Family("spectral", "spectral", "w_", WEIGHTS)
GRADIENT = Family("gradient", "other", "", FORWARD)
REPRESENTATION = Family("representation", "topological", "rep_", STATES, verdict="representation")
DISTANCE = Family("distance", "topological", "", PREVIOUS)
SCALE_FREE = Family("scale_free", "topological", "", WEIGHTS, verdict="scale_free")
HEAVY_TAIL = Family("heavy_tail", "spectral", "", WEIGHTS, verdict="heavy_tail")
LANDSCAPE = Family("landscape", "topological", "ls_", FORWARD, verdict="landscape")
CURVATURE = Family("curvature", "geometric", "hess_", FORWARD, verdict="curvature")
GRADIENT_TOPOLOGY = Family("gradient_topology", "topological", "gt_", FORWARD, verdict="gradient_topology")
FAMILIES = (NP, VR, SPECTRAL, SCALE_FREE, HEAVY_TAIL, GRADIENT, REPRESENTATION, LANDSCAPE, CURVATURE)
TRAJECTORY = Family("trajectory", "topological", "traj_", PREVIOUS, verdict="trajectory")
FAMILIES += (GRADIENT_TOPOLOGY, DISTANCE, TRAJECTORY)
# The analysis's, not the features stage's: what the changepoints of a run's topological series say by a cutoff
CHANGEPOINTS = Family("changepoints", "topological", "cp_", RUN, verdict="changepoints")
_VR_SUMMARY = (
    ("tp0", "sum", "total persistence of the finite H0 bars"),
    ("tp1", "sum", "total persistence of the H1 bars"),
    ("entropy0", "sum", "persistence entropy (nats, not normalised) of the finite H0 bars"),
    ("entropy1", "sum", "persistence entropy (nats, not normalised) of the H1 bars"),
    ("count1", "sum", "number of H1 bars"),
    ("maxpers1", "max", "largest H1 lifetime (0 without bars)"),
)
_SLICE_SUMMARY = (  # topometrics.landscape.sublevel.SUMMARY_KEYS, in order
    ("minima", "number of local minima (H0 bars, lower-star, 4-neighbourhood)"),
    ("saddles", "number of merges (finite H0 bars)"),
    ("tp", "total persistence of the finite H0 bars (nats)"),
    ("mean_pers", "mean persistence of the finite H0 bars (nats, 0 without any)"),
    ("max_pers", "largest persistence of a finite H0 bar (nats, 0 without any)"),
    ("centre_basin", "share of the grid whose steepest descent ends where the centre's does"),
    ("range", "max - min loss (nats)"),
)
# A slice's range and basin share measure its shape (geometry); only its bars, minima and merges (persistence,
# saddles, Betti-0-type counts) are topological.
_SLICE_GEOMETRIC = frozenset({"range", "centre_basin"})

# Every feature, family by family in the order the features tables list them.
FEATURES = (
    Feature("np_norm", NP, "mean_std", "neural persistence, reference normalisation (docs/features.md)"),
    Feature("np_sum", NP, "mean_std", "neural persistence as the paper's eq. 1: sum_e (1 - a_e) / (|V| - 1)"),
    Feature("np_shuffled_norm", NP, "mean_std", "np_norm of the layer's entries after a seeded permutation"),
    *(
        Feature(f"vr_{key}", VR, agg, f"{text} of the Vietoris-Rips filtration of the rows")
        for key, agg, text in _VR_SUMMARY
    ),
    Feature("w_rankme", SPECTRAL, "mean", "RankMe exp(-sum p_k ln p_k), p_k = s_k / sum s, of the singular values"),
    Feature("w_pr", SPECTRAL, "mean", "participation ratio (sum s^2)^2 / sum s^4 of the singular values"),
    Feature("w_fro", SPECTRAL, "norm", "Frobenius norm of the weight matrix"),
    Feature("w_spec", SPECTRAL, "max", "spectral norm (largest singular value) of the weight matrix"),
    *(
        Feature(f"vr_unit_{key}", SCALE_FREE, agg, f"{text} of the Vietoris-Rips filtration of the unit rows (chords)")
        for key, agg, text in _VR_SUMMARY
    ),
    *(
        Feature(f"vr_fnorm_{key}", SCALE_FREE, agg, f"{text} of the Vietoris-Rips filtration of the rows of W/||W||_F")
        for key, agg, text in _VR_SUMMARY
    ),
    Feature(
        "np_excess", SCALE_FREE, "mean_finite", "np_norm with the layer's own max |w| minus its shuffled nulls' mean"
    ),
    Feature(
        "np_z", SCALE_FREE, "mean_finite", "RMS spanning-tree persistence (max|w| - |w_e|) / std|w| of z-scored |W|"
    ),
    Feature("w_alpha", HEAVY_TAIL, "mean_finite", "power-law tail exponent of the eigenvalues of W^T W (CSN fit)"),
    Feature(
        "rep_alpha",
        HEAVY_TAIL,
        MODEL,
        "power-law tail exponent of the hidden-state covariance eigenvalues",
        input=STATES,
    ),
    Feature("grad_norm", GRADIENT, "norm", "Frobenius norm of d loss / d W (bias excluded) on the fixed batch"),
    Feature("batch_loss", GRADIENT, MODEL, "mean next-token cross-entropy (nats) on the fixed batch"),
    Feature(
        "batch_bpb", GRADIENT, MODEL, "batch_loss in bits per UTF-8 byte of the text the batch's targets stand for"
    ),
    Feature("rep_tp0", REPRESENTATION, MODEL, "total persistence of the hidden-state cloud's finite H0 bars"),
    Feature("rep_tp1", REPRESENTATION, MODEL, "total persistence of the hidden-state cloud's H1 bars"),
    Feature("rep_entropy0", REPRESENTATION, MODEL, "persistence entropy of the cloud's finite H0 bars"),
    Feature("rep_entropy1", REPRESENTATION, MODEL, "persistence entropy of the cloud's H1 bars"),
    Feature("rep_count1", REPRESENTATION, MODEL, "number of H1 bars of the hidden-state cloud"),
    Feature("rep_maxpers1", REPRESENTATION, MODEL, "largest H1 lifetime of the hidden-state cloud"),
    Feature(
        "rep_significant0",
        REPRESENTATION,
        MODEL,
        "finite H0 bars longer than significance x the longest",
        in_verdict=False,
    ),
    Feature(
        "rep_significant1", REPRESENTATION, MODEL, "H1 bars longer than significance x the longest", in_verdict=False
    ),
    Feature(
        "rep_diameter",
        REPRESENTATION,
        MODEL,
        "diameter of the subsampled, projected cloud (Betti scale unit)",
        in_verdict=False,
    ),
    Feature(
        "rep_betti0",
        REPRESENTATION,
        MODEL,
        "H0 Betti curve: bars alive at scale XX / (S - 1)",
        per_scale=True,
        in_verdict=False,
    ),
    Feature(
        "rep_betti1",
        REPRESENTATION,
        MODEL,
        "H1 Betti curve: bars alive at scale XX / (S - 1)",
        per_scale=True,
        in_verdict=False,
    ),
    Feature(
        "rep_rankme", REPRESENTATION, MODEL, "RankMe of the centred hidden states", kind="spectral", in_verdict=False
    ),
    Feature(
        "rep_pr",
        REPRESENTATION,
        MODEL,
        "participation ratio of the hidden-state covariance",
        kind="spectral",
        in_verdict=False,
    ),
    *(
        Feature(
            f"ls_{pair}_{key}",
            LANDSCAPE,
            MODEL,
            f"{text} of the loss slice along the {where} (docs/features.md)",
            kind="geometric" if key in _SLICE_GEOMETRIC else None,
        )
        for pair, where in (("rand", "random filter-normalised directions"), ("hess", "top-2 Hessian eigenvectors"))
        for key, text in _SLICE_SUMMARY
    ),
    Feature(
        "ls_rand_range_global",
        LANDSCAPE,
        MODEL,
        "max - min loss (nats) of the random directions' slice at radius 1 on a 5 x 5 grid: mostly the loss of a "
        "destroyed network, not local sharpness",
        kind="geometric",
        in_verdict=False,
    ),
    *(
        Feature(
            f"ls_{pair}_curv",
            LANDSCAPE,
            MODEL,
            f"(d1^T H d1 + d2^T H d2) / 2 along the {where} (filter-normalised, unscaled): the slice's curvature "
            "at the weights (nats per squared direction unit)",
            kind="geometric",
            in_verdict=False,
        )
        for pair, where in (("rand", "random slice's directions"), ("hess", "Hessian slice's eigenvectors"))
    ),
    *(
        Feature(
            f"hess_eig{i}", CURVATURE, MODEL, f"{label} eigenvalue of the Hessian of the fixed-batch loss (Lanczos)"
        )
        for i, label in ((1, "largest"), (2, "second largest"), (3, "third largest"))
    ),
    Feature(
        "hess_trace",
        CURVATURE,
        MODEL,
        "trace of the Hessian of the fixed-batch loss (exact up to features.hessian_exact_max parameters, else "
        "deflated Hutchinson to a relative standard error of features.hessian_trace_rse)",
    ),
    Feature("hess_eig1_over_trace", CURVATURE, MODEL, "hess_eig1 / hess_trace: the top direction's share"),
    Feature(
        "hess_trace_se",
        CURVATURE,
        MODEL,
        "standard error of hess_trace (0 when exact; the Hutchinson probes' when estimated)",
        kind="geometric",
        in_verdict=False,
    ),
    *(
        Feature(f"gt_{unit}{key}", GRADIENT_TOPOLOGY, agg, f"{text} of the layer's per-example weight gradients{what}")
        for unit, what in (("", ""), ("unit_", " scaled to unit norm"))
        for key, agg, text in _VR_SUMMARY
    ),
    *(
        Feature(f"gt_net_{unit}{key}", GRADIENT_TOPOLOGY, MODEL, f"{text} of the whole network's projected{what} cloud")
        for unit, what in (("", ""), ("unit_", " unit-norm"))
        for key, _agg, text in _VR_SUMMARY
    ),
    Feature(
        "gt_noise_scale",
        GRADIENT_TOPOLOGY,
        MODEL,
        "gradient-noise scale tr(Sigma) / |g_mean|^2 of the per-example gradients (baseline, not topology)",
        kind="other",
        in_verdict=False,
    ),
    Feature(
        "gt_mean_cosine",
        GRADIENT_TOPOLOGY,
        MODEL,
        "mean pairwise cosine of the per-example gradients (baseline, not topology)",
        kind="other",
        in_verdict=False,
    ),
    Feature("vr_w1_prev", DISTANCE, "sum", "1-Wasserstein distance of the layer's diagram to the previous one"),
    Feature("vr_bneck_prev", DISTANCE, "sum", "bottleneck distance of the layer's diagram to the previous one"),
    Feature("rep_w1_prev", DISTANCE, MODEL, "1-Wasserstein distance of the representation diagram to the previous"),
    Feature("rep_bneck_prev", DISTANCE, MODEL, "bottleneck distance of the representation diagram to the previous"),
    Feature("traj_phdim", TRAJECTORY, MODEL, "PH0 dimension of the run's sketched iterates in the trailing window"),
    Feature(
        "traj_ckpt_phdim", TRAJECTORY, MODEL, "PH0 dimension of the checkpoints (as iterates) in the trailing window"
    ),
    Feature(
        "cp_count",
        CHANGEPOINTS,
        MODEL,
        "changepoints (PELT) of the run's topological headline series in the checkpoints observed by the cutoff",
    ),
    Feature(
        "cp_first", CHANGEPOINTS, MODEL, "the first of them as a share of the run's steps (the cutoff's while none)"
    ),
)

_DECLARED = {feature.name: feature for feature in FEATURES}
_SCALE = re.compile(r"^(?P<name>.+)_\d{2,}$")
_STD = "_std"


def named(family: Family, values: dict[str, float]) -> dict[str, float]:
    """A computing function's ``{key: value}`` under the family's feature names (``tp0`` -> ``vr_tp0``)."""
    return {family.prefix + key: value for key, value in values.items()}


def per_layer(family: Family) -> tuple[str, ...]:
    """Names of the family's features computed for every linear layer, in order."""
    return tuple(f.name for f in family.features if f.aggregate != MODEL)


def model_level(family: Family, scales: int = 0) -> tuple[str, ...]:
    """Names of the family's ``layer='all'`` rows, in order: each per-layer feature's aggregate
    (and ``<name>_std`` right after a ``mean_std`` one), then the model-level features, curves
    expanded to ``scales`` names each."""
    return _layer_all_names(family.features, scales)


def _layer_all_names(features: tuple[Feature, ...], scales: int) -> tuple[str, ...]:
    names = []
    for feature in features:
        if feature.per_scale:
            names += [f"{feature.name}_{i:02d}" for i in range(scales)]
            continue
        names.append(feature.name)
        if feature.aggregate == "mean_std":
            names.append(feature.name + _STD)
    return tuple(names)


def model_only(family: Family, scales: int = 0) -> tuple[str, ...]:
    """Names of the family's features computed once per checkpoint (``layer='all'`` only), in order."""
    return tuple(n for n in model_level(family, scales) if lookup(n).aggregate == MODEL)


class Rows(NamedTuple):
    """Names of feature rows: those of every linear layer, and those of ``layer='all'``."""

    per_layer: tuple[str, ...]
    model_level: tuple[str, ...]


def computed_from(*inputs: str, scales: int = 0) -> Rows:
    """The rows of the features computed from ``inputs`` (:data:`INPUTS`), in :data:`FEATURES` order:
    the rows that are NULL together when those inputs are unusable (e.g. ``computed_from(FORWARD, STATES)``
    when the forward pass fails). ``scales``: names per curve (``features.betti_scales``)."""
    unknown = [i for i in inputs if i not in INPUTS]
    if unknown:
        raise ValueError(f"unknown inputs {unknown}; one of {INPUTS}")
    features = tuple(f for f in FEATURES if (f.input or f.family.input) in inputs)
    return Rows(tuple(f.name for f in features if f.aggregate != MODEL), _layer_all_names(features, scales))


def run_level(name: str) -> bool:
    """Whether a feature is a summary of the run up to a cutoff (input ``run``), not a per-checkpoint value."""
    feature = lookup(name)
    return feature is not None and (feature.input or feature.family.input) == RUN


def verdict_families() -> dict[str, tuple[str, ...]]:
    """The between-run verdict's families (:mod:`topometrics.verdict.verdict`): family name -> the ``layer='all'``
    features whose level and rate it adds, in :data:`FEATURES` order (families with a ``verdict`` name,
    less the features declared ``in_verdict=False``)."""
    out: dict[str, tuple[str, ...]] = {}
    for feature in FEATURES:
        if feature.family.verdict is not None and feature.in_verdict:
            out[feature.family.verdict] = (*out.get(feature.family.verdict, ()), feature.name)
    return out


def lookup(name: str) -> Feature | None:
    """The declaration behind a name in the ``feature`` column (``np_norm_std`` -> ``np_norm``,
    ``rep_betti0_07`` -> ``rep_betti0``), or None for an undeclared name."""
    if name in _DECLARED:
        return _DECLARED[name]
    if name.endswith(_STD) and name[: -len(_STD)] in _DECLARED:
        feature = _DECLARED[name[: -len(_STD)]]
        return feature if feature.aggregate == "mean_std" else None
    match = _SCALE.match(name)
    if match and match["name"] in _DECLARED and _DECLARED[match["name"]].per_scale:
        return _DECLARED[match["name"]]
    return None


def kind(name: str) -> str:
    """'topological', 'spectral', 'geometric' or 'other' for a name in the ``feature`` column ('other' if
    undeclared)."""
    feature = lookup(name)
    if feature is None:
        return "other"
    return feature.kind or feature.family.kind


def names(*wanted: str) -> tuple[str, ...]:
    """``wanted`` unchanged, after checking that each is a declared feature name (a typo fails at import)."""
    unknown = [n for n in wanted if lookup(n) is None]
    if unknown:
        raise ValueError(f"undeclared feature names {unknown}; declare them in topometrics/vocabulary.py")
    return wanted
