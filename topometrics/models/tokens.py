"""The character-level tokenizer and the prepared token files (``train.u8``, ``val.u8``).

Vocabulary 128: ASCII code points 0-126 map to themselves and every other character (including
DEL) to the reserved id 127. A prepared corpus directory holds one uint8 id per character per
split and ``source.json``, the corpus stage's record of them (token counts and each file's sha256,
``tokens_sha256``); :func:`load_tokens` is the one reader of those files, and it checks them against
the record first: a truncated or changed token file would otherwise train new runs on other data
under the same recipe fingerprint.

With ``data.tokenizer: {kind: bpe, ...}`` (:mod:`topometrics.models.bpe`) the record says so
(``tokenizer``: kind, vocab_size, sha256 of ``tokenizer.json``) and a vocabulary above 256 ids is stored
as uint16 in ``<split>.u16`` (:func:`token_dtype`); :func:`vocab_size` is the model's vocabulary.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np

from topometrics.errors import TopometricsError
from topometrics.models import bpe

UNKNOWN_ID = 127  # every non-ASCII character (and DEL) maps here
CHAR_VOCAB = 128  # the character tokenizer's vocabulary
SPLITS = ("train", "val")
_SUFFIX = {np.dtype(np.uint8): "u8", np.dtype(np.uint16): "u16"}


class MissingTokensError(TopometricsError, FileNotFoundError):
    """A prepared split is missing: the corpus stage has not run."""


class TokensError(TopometricsError, ValueError):
    """A prepared split or its record is not what the corpus stage wrote."""


def encode(text: str) -> np.ndarray:
    """Text -> (n,) uint8 token ids; characters outside ASCII 0-126 become :data:`UNKNOWN_ID`."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    return np.where(codes < UNKNOWN_ID, codes, UNKNOWN_ID).astype(np.uint8)


def decode(ids: np.ndarray) -> str:
    """(n,) token ids -> text; the unknown id decodes to U+FFFD."""
    return "".join("\ufffd" if i == UNKNOWN_ID else chr(i) for i in np.asarray(ids, dtype=np.int64))


def vocabulary() -> list[str]:
    """id -> symbol table written beside the prepared data."""
    return [chr(i) for i in range(UNKNOWN_ID)] + ["\ufffd"]


def vocab_size(record: dict) -> int:
    """The model's vocabulary for a prepared corpus's record: the tokenizer's (128 for characters)."""
    return int((record.get("tokenizer") or {}).get("vocab_size", CHAR_VOCAB))


def token_dtype(vocab: int) -> np.dtype:
    """The stored id type: uint8 up to 256 ids, uint16 above (data.tokenizer.vocab_size <= 65,535)."""
    return np.dtype(np.uint8 if vocab <= 256 else np.uint16)


def token_file(corpus_dir: Path, split: str, dtype: np.dtype | type = np.uint8) -> Path:
    """``<corpus_dir>/<split>.u8`` (or ``.u16`` for uint16 ids), the file of a prepared split ('train' or 'val')."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return Path(corpus_dir) / f"{split}.{_SUFFIX[np.dtype(dtype)]}"


def load_tokens(corpus_dir: Path, split: str) -> np.ndarray:
    """(n,) token ids (uint8, or uint16 for a vocabulary above 256) of a prepared split ('train' or 'val'),
    checked against ``source.json`` (:func:`token_problem`; a directory without one, made by hand, is read
    as it is)."""
    record = read_record(corpus_dir) if (Path(corpus_dir) / "source.json").exists() else {}
    dtype = token_dtype(vocab_size(record))
    path = token_file(corpus_dir, split, dtype)
    if not path.exists():
        raise MissingTokensError(f"{path} is missing; run the corpus stage first (dvc repro corpus)")
    ids = np.fromfile(path, dtype=dtype)
    if problem := token_problem(ids, split, record):
        raise TokensError(f"{Path(corpus_dir) / problem}; run `dvc repro corpus` (the corpus stage rewrites it)")
    return ids


def read_record(corpus_dir: Path) -> dict:
    """``source.json`` of a prepared corpus directory; :class:`TokensError` naming it when missing or unreadable."""
    path = Path(corpus_dir) / "source.json"
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError as err:
        raise MissingTokensError(f"{path} is missing; run the corpus stage first (dvc repro corpus)") from err
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise TokensError(f"{path} is not valid JSON ({err}); run `dvc repro corpus` (it rewrites it)") from err
    if not isinstance(record, dict):
        raise TokensError(f"{path} is not the corpus stage's record; run `dvc repro corpus` (it rewrites it)")
    return record


def tokens_sha256(ids: np.ndarray) -> str:
    """sha256 (hex) of a split's ids as stored (uint8: one byte each; uint16: two, little-endian)."""
    stored = ids if ids.dtype == np.uint16 else np.asarray(ids, dtype=np.uint8)
    return hashlib.sha256(np.ascontiguousarray(stored.astype(stored.dtype.newbyteorder("<"))).data).hexdigest()


def token_problem(ids: np.ndarray, split: str, record: dict) -> str | None:
    """``<split>.u8: <why>`` when the ids read from a split's file are not those ``record`` (source.json)
    counts and hashes, else None (also for what the record does not say)."""
    name = f"{split}.{'u16' if ids.dtype == np.uint16 else 'u8'}"
    count = record.get(f"{split}_tokens")
    if count is not None and ids.size != count:
        return f"{name}: {ids.size:,} tokens where source.json records {count:,} (truncated or extended)"
    recorded = (record.get("tokens_sha256") or {}).get(split)
    if recorded is not None and (digest := tokens_sha256(ids)) != recorded:
        hashes = f"sha256 {digest[:12]}..., source.json's {recorded[:12]}..."
        return f"{name}: content changed after the corpus stage wrote it ({hashes})"
    return None


def tokenizer_sha256(record: dict) -> str | None:
    """The sha256 of a BPE corpus's ``tokenizer.json`` (its identity), None for characters."""
    return (record.get("tokenizer") or {}).get("sha256")


def bits_per_byte(nats: float, tokens: int, n_bytes: float | None) -> float:
    """Mean nats per token over ``tokens`` tokens -> bits per UTF-8 byte of the ``n_bytes`` they stand for
    (NaN when the bytes are unknown)."""
    return nats * tokens / n_bytes / math.log(2) if n_bytes else math.nan


def token_bytes(corpus_dir: Path, record: dict, val_ids: np.ndarray) -> np.ndarray | None:
    """(vocab,) float64: the UTF-8 bytes each id stands for, so a loss in nats per token becomes bits per byte.

    A BPE's tokens are byte strings (exact; ``tokenizer.json`` is checked against its recorded sha256). A
    character id below 127 is one byte; the unknown id stands for every non-ASCII character, so it counts
    the validation text's mean bytes per such character (``val_bytes`` in the record minus the ASCII
    ones, over their count). None when that mean is needed and the record predates ``val_bytes``.
    """
    if sha := tokenizer_sha256(record):
        return bpe.token_byte_lengths(bpe.load_bpe(corpus_dir, sha)).astype(np.float64)
    lengths = np.ones(CHAR_VOCAB)
    unknown = int(np.count_nonzero(val_ids == UNKNOWN_ID))
    if unknown:
        if "val_bytes" not in record:
            return None
        lengths[UNKNOWN_ID] = (record["val_bytes"] - (val_ids.size - unknown)) / unknown
    return lengths


def decode_prepared(corpus_dir: Path, ids: np.ndarray) -> str:
    """A prepared corpus's ids back to text with the tokenizer that made them (``tokenizer.json`` for a BPE,
    checked against its recorded sha256; the characters otherwise, the unknown id as U+FFFD)."""
    record = read_record(corpus_dir) if (Path(corpus_dir) / "source.json").exists() else {}
    if sha := tokenizer_sha256(record):
        return bpe.decode(bpe.load_bpe(corpus_dir, sha), ids)
    return decode(ids)
