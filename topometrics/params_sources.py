"""params.yaml's ``series`` and ``compute`` sections: where external checkpoints come from and where
per-checkpoint work runs; and ``data.tokenizer``, what the text becomes. Frozen dataclasses validated
which composes them into ``Params``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from topometrics.params_schema import (
    ParamsError,
    build,
    check_name,
    check_seeds,
    missing,
    non_negative,
    positive,
    within,
)

TOKENIZER_KINDS = ("char", "bpe")  # data.tokenizer: the 128-symbol characters, or a byte-level BPE


@dataclass(frozen=True)
class SeriesSource:
    """One external checkpoint series: hub revisions, a run folder, or a live monitor's log folder."""

    model: str | None = None  # Hugging Face model id, e.g. EleutherAI/pythia-14m
    revisions: tuple[str, ...] = ()  # hub branches/tags, one checkpoint each; the step is read from 'step<N>'
    path: str | None = None  # or a run folder: Trainer checkpoint-<step>/ folders or <name>-<step>.safetensors files
    log: str | None = None  # or a TopologyMonitor log folder (features-<step>.parquet, losses-*.parquet)
    losses: str | None = None  # path: a CSV/JSONL of losses by step (step, val_loss/eval_loss, train_loss/loss)
    layers: dict[str, str] | None = None  # canonical part -> tensor-name regex, (\d+) = block; for unknown models
    seed: int = 0  # label for the seed column (e.g. a PolyPythia seed); not used in any computation

    def check(self, prefix: str) -> None:
        given = [k for k in ("model", "path", "log") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ParamsError(
                f"{prefix}: give exactly one of model (a Hugging Face id), path (a run folder) or log (a monitor log)"
            )
        if self.model is not None and not self.revisions:
            raise ParamsError(f"{prefix}.revisions is empty; list the hub revisions, e.g. [step0, step1000]")
        if self.model is None and self.revisions:
            raise ParamsError(f"{prefix}.revisions applies to model only; a local folder's steps come from its names")
        if self.path is None and self.losses is not None:
            raise ParamsError(f"{prefix}.losses applies to path only (a run folder of safetensors files)")
        if self.log is not None and self.layers is not None:
            raise ParamsError(f"{prefix}.layers does not apply to a monitor log (its layers are named already)")
        non_negative(self, prefix, ("seed",))
        check_seeds(f"{prefix}.seed", (self.seed,))


@dataclass(frozen=True, kw_only=True)
class SeriesParams:
    # series name (the rung column) -> source; params.yaml's: the paper's Pythia validation (section 4.8, Table 8)
    sources: dict[str, SeriesSource]
    seq_len: int  # tokens of the model's own tokenizer per validation window (features.rep_batch windows)

    def check(self) -> None:
        positive(self, "series", ("seq_len",))
        for name, source in self.sources.items():
            source.check(f"series.sources.{name}")


@dataclass(frozen=True)
class SecurityParams:
    """TLS files of a Dask cluster: paths only, never keys or passwords (docs/scaling.md)."""

    ca: str = ""  # PEM certificate of the CA that signed the scheduler's and this client's certificates
    cert: str = ""  # PEM certificate of this client
    key: str | None = None  # its PEM private key (None: appended to cert)


@dataclass(frozen=True, kw_only=True)
class ComputeParams:
    cluster: str  # local (this machine) | tcp://host:8786 | tls://host:8786 | a scheduler file
    security: SecurityParams | None = None  # TLS files, required for tls:// (optional: only a TLS cluster has them)
    connect_timeout_s: float  # wait this long for the scheduler and its first worker, then fail

    def check(self) -> None:
        positive(self, "compute", ("connect_timeout_s",))
        if not self.cluster:
            raise ParamsError("compute.cluster is empty; use local, tcp://host:8786, tls://host:8786 or a file")


def parse_series(raw: object) -> SeriesParams:
    """``series``: scalar keys as usual; ``sources`` maps series names (letters, digits, '-', '_') to sources."""
    if not isinstance(raw, dict):
        raise ParamsError(f"series must be a mapping, got {type(raw).__name__}")
    if "sources" not in raw:
        raise missing("series.sources")
    sources_raw = raw["sources"] or {}  # `sources:` with nothing under it: no series
    params = build(SeriesParams, raw | {"sources": {}}, "series")
    if not isinstance(sources_raw, dict):
        raise ParamsError("series.sources must map series names to {model, revisions} or {path}")
    sources = {}
    for name, source in sources_raw.items():
        check_name("series.sources", name, "-_.", "pythia-14m")
        sources[name] = build(SeriesSource, source or {}, f"series.sources.{name}")
    return dataclasses.replace(params, sources=sources)


def parse_compute(raw: object) -> ComputeParams:
    """``compute``: scalar keys as usual; ``security`` maps ca, cert (and key) to PEM file paths."""
    if not isinstance(raw, dict):
        raise ParamsError(f"compute must be a mapping, got {type(raw).__name__}")
    params = build(ComputeParams, {k: v for k, v in raw.items() if k != "security"}, "compute")
    if raw.get("security") is None:
        return params
    security = build(SecurityParams, raw["security"], "compute.security")
    if not security.ca or not security.cert:
        raise ParamsError("compute.security needs ca and cert (PEM file paths), and key unless cert holds it")
    return dataclasses.replace(params, security=security)


@dataclass(frozen=True)
class TokenizerParams:
    """``data.tokenizer``: ``char`` (written as the bare word) or ``{kind: bpe, vocab_size: N}``."""

    kind: str  # char | bpe
    vocab_size: int = 0  # bpe: 256 byte tokens + merges, in [257, 65535]; the text may support fewer (capped)

    def check(self) -> None:
        if self.kind not in TOKENIZER_KINDS:
            raise ParamsError(
                f"data.tokenizer.kind must be char or bpe, got {self.kind!r}; e.g. {{kind: bpe, vocab_size: 512}}"
            )
        if self.kind == "bpe":
            within(self, "data.tokenizer", "vocab_size", 257, 65_535, "256 bytes + at least one merge, ids fit uint16")


def parse_tokenizer(data: dict) -> TokenizerParams:
    """``data.tokenizer``: the word ``char``, or a mapping such as ``{kind: bpe, vocab_size: 512}``."""
    if "tokenizer" not in data:
        raise missing("data.tokenizer")
    tok = data["tokenizer"]
    return TokenizerParams(kind=tok) if isinstance(tok, str) else build(TokenizerParams, tok, "data.tokenizer")
