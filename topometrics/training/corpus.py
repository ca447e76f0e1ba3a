"""Resolve, verify and tokenise the training corpus.

Resolution order for ``data.corpus``:

1. ``wikitext-2-raw-v1`` (the default): an already prepared copy whose ``source.json``
   says it is WikiText-2 is reused; otherwise the archive is downloaded from each URL
   in ``data.urls`` in turn and verified (archive size and SHA-256, then each member's).
2. A local path: a UTF-8 text file, or a directory (see :func:`split_local`).
3. When WikiText-2 cannot be downloaded and no local copy exists, an **offline
   fallback** of real English text that every Python install has (the Python
   documentation topics in ``pydoc_data``) is used, and this is said loudly: a
   warning, ``source.json`` (requested, used, checksum, reason) and later the report.

Tokenisation (``data.tokenizer``: characters, 128 symbols, by default; or a byte-level BPE trained here on
the training split only, saved as ``tokenizer.json``: ``topometrics.models.bpe``) and the one reader of the
prepared token files are ``topometrics.models.tokens``.

Why over 400 lines: the download, its checksums, the fallback and the split checks are one promise (the
corpus stage's output is exactly the named text, or says loudly what it is instead) and write one
``source.json``; each function is short.
"""

from __future__ import annotations

import hashlib
import io
import json
import time
import urllib.error
import urllib.request
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from topometrics.atomic import write_array, write_text
from topometrics.errors import TopometricsError
from topometrics.models import bpe
from topometrics.models.tokens import (
    SPLITS,
    UNKNOWN_ID,
    encode,
    token_dtype,
    token_file,
    token_problem,
    tokens_sha256,
    vocab_size,
    vocabulary,
)
from topometrics.params import TokenizerParams

WIKITEXT = "wikitext-2-raw-v1"
FALLBACK = "python-docs-offline"

# Published size and SHA-256 of the raw v1 archive and its members (shared/data/wikitext-2/README.md).
WIKITEXT_ARCHIVE = (4_721_645, "ef7edb566e3e2b2d31b29c1fdb0c89a4cc683597484c3dc2517919c615435a11")
WIKITEXT_MEMBERS = {
    "wikitext-2-raw/wiki.train.raw": (10_940_747, "6707892fa3788b5ab9ed78ab5ff37d9fe825f6011a2ad4fcd6a6d467f0e7da57"),
    "wikitext-2-raw/wiki.valid.raw": (1_146_846, "4cd0f6876d07a413aa911261ff6d363c72d757d47f0fdd6015702014c89cb9c7"),
    "wikitext-2-raw/wiki.test.raw": (1_290_590, "173c87a53759e0201f33e0ccf978e510c2042d7f2cb78229d9a50d79b9e7dd08"),
}


class CorpusError(TopometricsError, RuntimeError):
    """The corpus cannot be resolved or failed verification."""


class FallbackWarning(UserWarning):
    """Training runs on the offline fallback corpus, not the one requested."""


class CappedVocabularyWarning(UserWarning):
    """The training text supports fewer BPE merges than data.tokenizer.vocab_size asks for."""


@dataclass(frozen=True)
class Corpus:
    train: str  # training text
    val: str  # held-out validation text
    source: dict  # requested, used, sha256, reason, fallback


# ---------------------------------------------------------------- download and verification


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def verify_archive(blob: bytes, expected: tuple[int, str], members: dict[str, tuple[int, str]]) -> dict[str, bytes]:
    """Check the archive's size and SHA-256, then each named member's; return the members' bytes."""
    size, digest = expected
    if len(blob) != size:
        raise CorpusError(f"archive is {len(blob):,} bytes, expected {size:,}")
    if sha256_bytes(blob) != digest:
        raise CorpusError(f"archive SHA-256 {sha256_bytes(blob)} does not match the published {digest}")
    out = {}
    with zipfile.ZipFile(io.BytesIO(blob)) as archive:
        for name, (msize, mdigest) in members.items():
            try:
                data = archive.read(name)
            except KeyError as err:
                raise CorpusError(f"archive has no member {name}") from err
            if len(data) != msize or sha256_bytes(data) != mdigest:
                raise CorpusError(f"member {name} fails its size/SHA-256 check")
            out[name] = data
    return out


def download(url: str, timeout_s: float) -> bytes:
    """Fetch a URL (http(s) or file) into memory; raises CorpusError naming the URL."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 (URLs come from params)
            return response.read()
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise CorpusError(f"cannot download {url}: {err}") from err


def fetch_wikitext(
    urls: tuple[str, ...],
    timeout_s: float,
    expected: tuple[int, str] | None = None,
    members: dict[str, tuple[int, str]] | None = None,
) -> Corpus:
    """Download and verify WikiText-2 raw from the first URL that works (train/valid members).

    ``expected``/``members`` default to the published checksums (module constants).
    """
    expected = expected or WIKITEXT_ARCHIVE
    members = members or WIKITEXT_MEMBERS
    errors = []
    for url in urls:
        try:
            blob = download(url, timeout_s)
            files = verify_archive(blob, expected, members)
        except CorpusError as err:
            errors.append(str(err))
            continue
        texts = {Path(name).name: data.decode("utf-8") for name, data in files.items()}
        source = {"requested": WIKITEXT, "used": WIKITEXT, "url": url, "sha256": expected[1], "fallback": False}
        return Corpus(train=texts["wiki.train.raw"], val=texts["wiki.valid.raw"], source=source | {"reason": ""})
    raise CorpusError("; ".join(errors) or "no URLs configured (data.urls is empty)")


# ---------------------------------------------------------------- local text and the offline fallback


def split_tail(text: str, val_fraction: float) -> tuple[str, str]:
    """Hold out the last ``val_fraction`` of the text, cut at a line boundary (train, val)."""
    cut = int(len(text) * (1.0 - val_fraction))
    newline = text.rfind("\n", 0, cut)
    cut = newline + 1 if newline > 0 else cut
    return text[:cut], text[cut:]


def split_local(path: Path, val_fraction: float) -> tuple[str, str]:
    """Read a local corpus and split it into (train, val).

    - a UTF-8 text file: the last ``val_fraction`` of it (at a line boundary) is validation;
    - a directory with files whose names contain ``train`` and ``valid`` (e.g. WikiText's
      ``wiki.train.raw`` / ``wiki.valid.raw``): those files are the two splits;
    - any other directory: its ``*.txt``/``*.raw``/``*.tokens`` files, sorted by name and
      concatenated, split like a single file.
    """
    path = Path(path)
    if path.is_file():
        return split_tail(_read_utf8(path), val_fraction)
    if not path.is_dir():
        raise CorpusError(f"data.corpus={str(path)!r} is neither '{WIKITEXT}' nor an existing file or directory")
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in (".txt", ".raw", ".tokens"))
    train = [p for p in files if "train" in p.name]
    valid = [p for p in files if "valid" in p.name]
    if len(train) == 1 and len(valid) == 1:
        return _read_utf8(train[0]), _read_utf8(valid[0])
    if not files:
        raise CorpusError(f"data.corpus directory {path} has no .txt, .raw or .tokens files")
    return split_tail("\n".join(_read_utf8(p) for p in files), val_fraction)


def _read_utf8(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise CorpusError(f"{path} is not UTF-8 text ({err}); convert it or point data.corpus elsewhere") from err


def offline_text() -> str:
    """Real English prose every CPython install carries: the documentation topics of ``pydoc``."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


def resolve(
    corpus: str, urls: tuple[str, ...], timeout_s: float, val_fraction: float, cached: dict | None
) -> Corpus | None:
    """Decide what to train on. Returns None when the cached preparation is still right.

    ``cached`` is the ``source.json`` of an existing preparation (or None).
    """
    if corpus != WIKITEXT:
        train, val = split_local(Path(corpus), val_fraction)
        digest = sha256_bytes((train + "\0" + val).encode("utf-8"))
        if cached and cached.get("used") == corpus and cached.get("sha256") == digest:
            return None
        return Corpus(
            train, val, {"requested": corpus, "used": corpus, "sha256": digest, "reason": "", "fallback": False}
        )
    if cached and cached.get("used") == WIKITEXT:
        return None
    try:
        return fetch_wikitext(urls, timeout_s)
    except CorpusError as err:
        reason = f"WikiText-2 could not be downloaded ({err})"
    text = offline_text()
    train, val = split_tail(text, val_fraction)
    digest = sha256_bytes(text.encode("utf-8"))
    warnings.warn(
        f"USING THE OFFLINE FALLBACK CORPUS ({FALLBACK}), NOT {WIKITEXT}: {reason}. "
        "Results are not comparable with the paper; re-run `dvc repro` with network access to use WikiText-2.",
        FallbackWarning,
        stacklevel=2,
    )
    source = {"requested": WIKITEXT, "used": FALLBACK, "sha256": digest, "reason": reason, "fallback": True}
    if cached and cached.get("used") == FALLBACK and cached.get("sha256") == digest:
        return None
    return Corpus(train, val, source)


# ---------------------------------------------------------------- the prepared directory (the stage's edge)


def read_source(out_dir: Path) -> tuple[dict | None, str | None]:
    """``source.json`` of a complete preparation whose token files are the ones it records, and why an
    existing preparation is not (it is then redone): ``(record, None)``, ``(None, reason)``, or ``(None, None)``
    when there is none.

    A record written before token files carried their sha256 gets it now (trust on first use, after
    the token counts it records are checked), so any later change is caught.
    """
    path = Path(out_dir) / "source.json"
    if not (path.exists() and all(f.exists() for f in _prepared_files(out_dir))):
        return None, None
    try:
        source = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None, f"{path}: not valid JSON"
    if not isinstance(source, dict):
        return None, f"{path}: not the corpus stage's record"
    dtype = token_dtype(vocab_size(source))
    ids = {split: np.fromfile(token_file(out_dir, split, dtype), dtype=dtype) for split in SPLITS}
    if problems := [f"{Path(out_dir) / p}" for split in SPLITS if (p := token_problem(ids[split], split, source))]:
        return None, "; ".join(problems)
    tok = source.get("tokenizer")
    tokenizer_json = Path(out_dir) / bpe.TOKENIZER_FILE
    if tok and bpe.content_sha256(tokenizer_json.read_text(encoding="utf-8")) != tok.get("sha256"):
        return None, f"{tokenizer_json}: content changed after the corpus stage wrote it"
    if "tokens_sha256" not in source or "unknown_share" not in source:
        source |= {"tokens_sha256": {split: tokens_sha256(ids[split]) for split in SPLITS}}
        source |= {"unknown_share": unknown_share(*ids.values())}
        write_text(path, json.dumps(source, indent=1, sort_keys=True))
    return source, None


def _prepared_files(out_dir: Path) -> list[Path]:
    """The files of a preparation; a BPE one (its record names the tokenizer) also has ``tokenizer.json``."""
    try:
        record = json.loads((Path(out_dir) / "source.json").read_text())
        tokenizer = record.get("tokenizer") if isinstance(record, dict) else None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        record, tokenizer = {}, None
    dtype = token_dtype(vocab_size(record if isinstance(record, dict) else {}))
    files = [token_file(out_dir, "train", dtype), token_file(out_dir, "val", dtype), Path(out_dir) / "vocab.json"]
    return files + ([Path(out_dir) / bpe.TOKENIZER_FILE] if tokenizer else [])


def same_tokenizer(cached: dict | None, tokenizer: TokenizerParams) -> bool:
    """Whether a prepared record was tokenised as ``data.tokenizer`` asks (kind and requested size), and its
    ``tokenizer.json`` is still the one it records (else the preparation is redone)."""
    recorded = (cached or {}).get("tokenizer")
    if tokenizer.kind == "char":
        return recorded is None
    return bool(recorded) and recorded.get("requested") == tokenizer.vocab_size


def tokenize(train_text: str, val_text: str, tokenizer: TokenizerParams) -> tuple[np.ndarray, np.ndarray, dict]:
    """Both splits as stored ids and the tokenizer's record entries (none for characters).

    A BPE is trained on the training text only, in ``train_s`` seconds; when the text supports fewer
    merges than asked, the vocabulary is what it supports (a :class:`CappedVocabularyWarning`, not an error).
    """
    if tokenizer.kind == "char":
        return encode(train_text), encode(val_text), {}
    t0 = time.perf_counter()
    tok = bpe.train_bpe([train_text], tokenizer.vocab_size)
    seconds = time.perf_counter() - t0
    text = bpe.to_json(tok)
    size = tok.get_vocab_size()
    if size < tokenizer.vocab_size:
        warnings.warn(
            f"data.tokenizer.vocab_size={tokenizer.vocab_size:,} is more than the training text supports: "
            f"capped at {size:,} tokens (256 bytes + {size - bpe.BYTE_TOKENS:,} merges)",
            CappedVocabularyWarning,
            stacklevel=2,
        )
    dtype = token_dtype(size)
    ids = [bpe.encode(tok, t).astype(dtype) for t in (train_text, val_text)]
    record = {"kind": "bpe", "requested": tokenizer.vocab_size, "vocab_size": size}
    record |= {"sha256": bpe.content_sha256(text), "train_s": round(seconds, 3), "json": text}
    return ids[0], ids[1], record


def min_split_tokens(seq_len: int) -> int:
    """Tokens a split needs: one window of ``seq_len`` inputs plus the next-token target, and a
    second start position (training samples random starts, validation spreads its windows)."""
    return seq_len + 2


def check_split_sizes(what: str, train_tokens: int, val_tokens: int, seq_len: int) -> None:
    """Refuse a corpus with a split shorter than one window, naming ``what`` (``data.corpus=...``),
    the sizes and the fix."""
    need = min_split_tokens(seq_len)
    if train_tokens < need or val_tokens < need:
        raise CorpusError(
            f"{what} gives {train_tokens:,} training and {val_tokens:,} validation characters; "
            f"each split needs at least data.seq_len + 2 = {need:,}; point data.corpus at more text "
            f"or lower data.seq_len"
        )


def unknown_share(*splits: np.ndarray) -> float:
    """The share of token ids that are :data:`~topometrics.models.tokens.UNKNOWN_ID` over all ``splits``."""
    total = sum(int(ids.size) for ids in splits)
    return sum(int(np.count_nonzero(ids == UNKNOWN_ID)) for ids in splits) / total if total else 0.0


def check_unknown_share(what: str, share: float, limit: float) -> None:
    """Refuse a corpus most of whose characters the tokenizer cannot tell apart (share above ``limit``,
    ``data.max_unknown_share``), naming the tokenizer's range and the fix.

    Valid UTF-8 in another script (CJK, emoji) becomes almost all one id: training then learns to
    predict it, a low loss that means nothing.
    """
    if share > limit:
        raise CorpusError(
            f"{what}: {share:.1%} of its characters are outside the character tokenizer's range (ASCII 0-126; "
            f"every other character becomes the unknown id {UNKNOWN_ID}), above data.max_unknown_share={limit}; "
            "point data.corpus at mostly-ASCII text (e.g. English) or raise data.max_unknown_share"
        )


def prepare(
    corpus: str,
    urls: tuple[str, ...],
    timeout_s: float,
    val_fraction: float,
    out_dir: Path,
    seq_len: int,
    max_unknown_share: float,
    tokenizer: TokenizerParams,
) -> dict:
    """Resolve the corpus and write ``train.u8``, ``val.u8`` (uint8 ids; ``.u16``, uint16, for a BPE
    vocabulary above 256), ``vocab.json``, ``tokenizer.json`` (BPE only) and ``source.json`` into
    ``out_dir``; leave them untouched when they are still right.

    A corpus with a split shorter than one window of ``seq_len``, or with a larger share of unknown
    characters than ``max_unknown_share`` (:func:`check_unknown_share`, characters only: a byte-level BPE
    has no unknown id), raises :class:`CorpusError` before anything in ``out_dir`` is touched.
    A preparation whose token files are not those its ``source.json`` records (truncated, changed), or
    made with another ``data.tokenizer``, is redone, and the record says why (``redone``).
    Returns the source record (with ``changed``: whether files were rewritten).
    """
    out_dir = Path(out_dir)
    cached, damage = read_source(out_dir)
    if cached is not None and not same_tokenizer(cached, tokenizer):
        cached, damage = None, f"{out_dir / 'source.json'}: made with another data.tokenizer"
    resolved = resolve(corpus, urls, timeout_s, val_fraction, cached)
    if resolved is None:
        sizes = cached.get("train_tokens", 0), cached.get("val_tokens", 0)
        check_split_sizes(f"data.corpus={corpus!r}", *sizes, seq_len)
        check_unknown_share(f"data.corpus={corpus!r}", cached["unknown_share"], max_unknown_share)
        return cached | {"changed": False}
    train, val, tok = tokenize(resolved.train, resolved.val, tokenizer)
    check_split_sizes(f"data.corpus={corpus!r}", int(train.size), int(val.size), seq_len)
    share = unknown_share(train, val) if tokenizer.kind == "char" else 0.0
    check_unknown_share(f"data.corpus={corpus!r}", share, max_unknown_share)
    out_dir.mkdir(parents=True, exist_ok=True)
    source = resolved.source | {"train_tokens": int(train.size), "val_tokens": int(val.size), "unknown_share": share}
    source |= {"tokens_sha256": {"train": tokens_sha256(train), "val": tokens_sha256(val)}}
    source |= {"val_bytes": len(resolved.val.encode("utf-8"))}  # bits per byte (topometrics.models.tokens)
    for path in _prepared_files(out_dir):  # a preparation of another tokenizer leaves no stale files
        path.unlink(missing_ok=True)
    for split, ids in (("train", train), ("val", val)):
        write_array(token_file(out_dir, split, ids.dtype), ids)
    if tok:
        write_text(out_dir / bpe.TOKENIZER_FILE, tok.pop("json"))
        source |= {"tokenizer": tok}
        symbols = sorted(
            bpe.Tokenizer.from_file(str(out_dir / bpe.TOKENIZER_FILE)).get_vocab().items(), key=lambda kv: kv[1]
        )
        write_text(out_dir / "vocab.json", json.dumps([symbol for symbol, _ in symbols], ensure_ascii=False))
    else:
        write_text(out_dir / "vocab.json", json.dumps(vocabulary(), ensure_ascii=False))
    write_text(out_dir / "source.json", json.dumps(source, indent=1, sort_keys=True))
    return source | {"changed": True} | ({"redone": damage} if damage else {})


def summary(source: dict, out_dir: Path) -> str:
    """What the corpus stage prints for :func:`prepare`'s record: one line (written or kept, the corpus used, token
    counts, FALLBACK with the reason), then the record as JSON."""
    state = "wrote" if source["changed"] else "kept"
    tokens = f"{source['train_tokens']:,} train / {source['val_tokens']:,} val tokens"
    tokens += f", {source['unknown_share']:.2%} unknown characters"
    if tok := source.get("tokenizer"):
        capped = f" (capped from {tok['requested']:,})" if tok["vocab_size"] < tok["requested"] else ""
        trained = f", trained in {tok['train_s']:.1f} s" if source["changed"] else ""
        tokens += f"; byte-level BPE of {tok['vocab_size']:,} tokens{capped}{trained}"
    fallback = f" FALLBACK: {source['reason']}" if source["fallback"] else ""
    record = {k: v for k, v in source.items() if k not in ("changed", "redone")}
    redone = f"corpus: {source['redone']}; rewriting the prepared corpus\n" if source.get("redone") else ""
    line = f"corpus: {state} {out_dir} ({source['used']}, {tokens}){fallback}"
    return f"{redone}{line}\n{json.dumps(record, sort_keys=True)}"
