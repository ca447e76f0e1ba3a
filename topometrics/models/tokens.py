"""The character-level tokenizer and the prepared token files (``train.u8``, ``val.u8``).

Vocabulary 128: ASCII code points 0-126 map to themselves and every other character (including
DEL) to the reserved id 127. A prepared corpus directory holds one uint8 id per character per
split; :func:`load_tokens` is the one reader of those files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from topometrics.errors import TopometricsError

UNKNOWN_ID = 127  # every non-ASCII character (and DEL) maps here
SPLITS = ("train", "val")


class MissingTokensError(TopometricsError, FileNotFoundError):
    """A prepared split is missing: the corpus stage has not run."""


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
    """(n,) uint8 token ids of a prepared split ('train' or 'val')."""
    path = token_file(corpus_dir, split)
    if not path.exists():
        raise MissingTokensError(f"{path} is missing; run the corpus stage first (dvc repro corpus)")
    return np.fromfile(path, dtype=np.uint8)
