"""The character-level tokenizer and the prepared token files (``train.u8``, ``val.u8``).

Vocabulary 128: ASCII code points 0-126 map to themselves and every other character (including
DEL) to the reserved id 127. A prepared corpus directory holds one uint8 id per character per
split and ``source.json``, the corpus stage's record of them (token counts and each file's sha256,
``tokens_sha256``); :func:`load_tokens` is the one reader of those files, and it checks them against
the record first: a truncated or changed token file would otherwise train new runs on other data
under the same recipe fingerprint.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from topometrics.errors import TopometricsError

UNKNOWN_ID = 127  # every non-ASCII character (and DEL) maps here
SPLITS = ("train", "val")


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


def token_file(corpus_dir: Path, split: str) -> Path:
    """``<corpus_dir>/<split>.u8``, the file of a prepared split ('train' or 'val')."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return Path(corpus_dir) / f"{split}.u8"


def load_tokens(corpus_dir: Path, split: str) -> np.ndarray:
    """(n,) uint8 token ids of a prepared split ('train' or 'val'), checked against ``source.json``
    (:func:`token_problem`; a directory without one, made by hand, is read as it is)."""
    path = token_file(corpus_dir, split)
    if not path.exists():
        raise MissingTokensError(f"{path} is missing; run the corpus stage first (dvc repro corpus)")
    ids = np.fromfile(path, dtype=np.uint8)
    record = read_record(corpus_dir) if (Path(corpus_dir) / "source.json").exists() else {}
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
    """sha256 (hex) of a split's ids as stored (one byte each)."""
    return hashlib.sha256(np.ascontiguousarray(ids, dtype=np.uint8).data).hexdigest()


def token_problem(ids: np.ndarray, split: str, record: dict) -> str | None:
    """``<split>.u8: <why>`` when the ids read from a split's file are not those ``record`` (source.json)
    counts and hashes, else None (also for what the record does not say)."""
    count = record.get(f"{split}_tokens")
    if count is not None and ids.size != count:
        return f"{split}.u8: {ids.size:,} tokens where source.json records {count:,} (truncated or extended)"
    recorded = (record.get("tokens_sha256") or {}).get(split)
    if recorded is not None and (digest := tokens_sha256(ids)) != recorded:
        hashes = f"sha256 {digest[:12]}..., source.json's {recorded[:12]}..."
        return f"{split}.u8: content changed after the corpus stage wrote it ({hashes})"
    return None
