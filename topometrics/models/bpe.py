"""The byte-level BPE tokenizer beside the characters: trained, saved, checked, and its byte lengths.

A byte-level BPE (Hugging Face ``tokenizers``: ``models.BPE``, ``BpeTrainer``, the ``ByteLevel``
pre-tokenizer and decoder) starts from the 256 byte values as its alphabet, so every string encodes
without an unknown symbol and ``decode(encode(text)) == text`` for any Unicode text. A vocabulary
of ``vocab_size`` holds the 256 byte tokens and ``vocab_size - 256`` merges (so minbpe's "3 merges"
is ``vocab_size=259``); a text with fewer distinct pairs to merge gives a smaller vocabulary, which
:func:`train_bpe` reports rather than refuses. The corpus stage saves the tokenizer as
``tokenizer.json`` beside the token files and records its sha256; :func:`load_bpe` refuses a file
whose content no longer matches that record (edited by hand), naming the file and the fix.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from topometrics.errors import TopometricsError

BYTE_TOKENS = 256  # the byte alphabet every byte-level BPE starts from
TOKENIZER_FILE = "tokenizer.json"


class TokenizerError(TopometricsError, ValueError):
    """``tokenizer.json`` is missing or is not the one the corpus stage recorded."""


def new_bpe() -> Tokenizer:
    """An untrained byte-level BPE: no prefix space (the text is kept as it is), no unknown token."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def train_bpe(texts: list[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE of (at most) ``vocab_size`` tokens trained on ``texts`` (the training split only).

    Deterministic: the same texts and size give the same ``tokenizer.json`` byte for byte.
    """
    tok = new_bpe()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=0,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def to_json(tok: Tokenizer) -> str:
    """The tokenizer as the text of ``tokenizer.json`` (no indentation: one canonical form)."""
    return tok.to_str(pretty=False)


def content_sha256(text: str) -> str:
    """sha256 (hex) of ``tokenizer.json``'s UTF-8 bytes: the tokenizer's identity in fingerprints."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def encode(tok: Tokenizer, text: str) -> np.ndarray:
    """Text -> (n,) int64 token ids (no special tokens are added)."""
    return np.asarray(tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)


def decode(tok: Tokenizer, ids: np.ndarray) -> str:
    """(n,) token ids -> text; exact for a byte-level BPE when the ids decode to whole UTF-8 characters."""
    return tok.decode([int(i) for i in np.asarray(ids)], skip_special_tokens=False)


def token_byte_lengths(tok: Tokenizer) -> np.ndarray:
    """(vocab,) int64: the UTF-8 bytes each token id stands for (a byte-level token's symbols map one to one
    onto bytes through the ByteLevel alphabet)."""
    vocab = tok.get_vocab()
    lengths = np.zeros(len(vocab), dtype=np.int64)
    for symbol, i in vocab.items():
        lengths[i] = len(symbol)  # one ByteLevel symbol = one byte
    return lengths


def load_bpe(corpus_dir: Path, sha256: str) -> Tokenizer:
    """``<corpus_dir>/tokenizer.json``, checked against the sha256 the corpus stage recorded."""
    path = Path(corpus_dir) / TOKENIZER_FILE
    fix = "run `dvc repro -f corpus` to train it again (then the runs retrain on its tokens)"
    if not path.exists():
        raise TokenizerError(f"{path} is missing; {fix}")
    text = path.read_text(encoding="utf-8")
    if (digest := content_sha256(text)) != sha256:
        raise TokenizerError(
            f"{path}: content changed after the corpus stage wrote it (sha256 {digest[:12]}..., "
            f"source.json's {sha256[:12]}...); restore it or {fix}"
        )
    return Tokenizer.from_str(text)
