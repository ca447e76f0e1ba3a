"""The byte-level BPE: lossless on any Unicode text, deterministic, minbpe's known answer, exact byte lengths."""

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.models.helpers import gpt2_byte_symbols
from topometrics.models import bpe
from topometrics.training.corpus import offline_text

WIKITEXT = Path(__file__).resolve().parents[3] / "shared" / "data" / "wikitext-2"


@pytest.fixture(scope="module")
def english():
    """A BPE of 600 tokens trained on real English prose (the offline corpus's first 200,000 characters)."""
    return bpe.train_bpe([offline_text()[:200_000]], 600)


# Every code point class the issue names: CJK, emoji (astral plane), combining marks, control characters.
PIECES = ["世界", "🎉", "👩\u200d💻", "e\u0301", "\x00", "\x07", "\r\n", "\ufeff", " the", "\u0915\u094d\u0937"]
UNICODE = st.lists(
    st.text(st.characters(codec="utf-8", categories=("L", "M", "N", "P", "S", "Z", "Cc", "Cf", "Co")), max_size=12)
    | st.sampled_from(PIECES),
    max_size=8,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(UNICODE)
def test_decode_of_encode_is_the_text_for_any_unicode(english, text):
    ids = bpe.encode(english, text)
    assert bpe.decode(english, ids) == text
    assert ids.size <= len(text.encode("utf-8"))  # at most one token per byte: no unknown symbol, no expansion


def test_the_empty_string_is_no_tokens(english):
    assert bpe.encode(english, "").size == 0 and bpe.decode(english, np.zeros(0, dtype=np.int64)) == ""


@settings(max_examples=100, deadline=None)
@given(UNICODE)
def test_token_byte_lengths_add_up_to_the_utf8_bytes_of_the_text(english, text):
    lengths = bpe.token_byte_lengths(english)
    assert lengths[bpe.encode(english, text)].sum() == len(text.encode("utf-8"))


def test_the_byte_lengths_are_each_tokens_bytes_through_the_gpt2_byte_alphabet(english):
    symbols = gpt2_byte_symbols()
    token_bytes = [bytes(symbols[c] for c in english.id_to_token(i)) for i in range(english.get_vocab_size())]
    assert bpe.token_byte_lengths(english).tolist() == [len(b) for b in token_bytes]
    assert sorted(b for b in token_bytes if len(b) == 1) == [bytes([i]) for i in range(256)]  # every byte is a token
    text = "naïve café, 世界 🎉\n"
    assert b"".join(token_bytes[i] for i in bpe.encode(english, text)) == text.encode("utf-8")


def test_the_same_text_and_size_train_a_byte_identical_tokenizer_twice():
    text = offline_text()[:100_000]
    first, second = (bpe.to_json(bpe.train_bpe([text], 700)) for _ in range(2))
    assert first == second and bpe.content_sha256(first) == bpe.content_sha256(second)
    assert json.loads(first)["model"]["type"] == "BPE"


def test_minbpe_example_three_merges_encode_to_five_tokens():
    # minbpe (Karpathy): "aaabdaaabac" with 3 merges -> [258, 100, 258, 97, 99], i.e. "aaab" d "aaab" a c.
    # A byte-level BPE holds the 256 byte tokens first, so 3 merges is vocab_size = 256 + 3 = 259.
    tok = bpe.train_bpe(["aaabdaaabac"], 259)
    ids = bpe.encode(tok, "aaabdaaabac")
    assert tok.get_vocab_size() == 259
    assert [tok.id_to_token(int(i)) for i in ids] == ["aaab", "d", "aaab", "a", "c"]
    assert ids.size == 5 and ids[0] == ids[2] == 258  # the third merge, as in minbpe


def test_a_vocabulary_larger_than_the_text_supports_stops_at_what_it_supports():
    tok = bpe.train_bpe(["aaabdaaabac"], 5000)
    assert 259 < tok.get_vocab_size() < 5000  # every pair merged once: no padding, no error


@pytest.mark.skipif(not (WIKITEXT / "wiki.valid.tokens").exists(), reason="shared WikiText-2 text is not here")
def test_no_validation_token_is_unknown_and_it_round_trips():
    """Train on WikiText-2's test split, encode its validation split: every id is a real token (no unknown
    symbol exists) and the text comes back exactly."""
    train = (WIKITEXT / "wiki.test.tokens").read_text(encoding="utf-8")[:300_000]
    val = (WIKITEXT / "wiki.valid.tokens").read_text(encoding="utf-8")[:100_000]
    tok = bpe.train_bpe([train], 512)
    ids = bpe.encode(tok, val)
    assert ids.min() >= 0 and ids.max() < tok.get_vocab_size() == 512
    assert tok.model.unk_token is None
    assert bpe.decode(tok, ids) == val
    assert bpe.token_byte_lengths(tok)[ids].sum() == len(val.encode("utf-8"))


def test_a_hand_edited_tokenizer_json_is_named_with_the_fix(tmp_path, english):
    text = bpe.to_json(english)
    (tmp_path / "tokenizer.json").write_text(text.replace('"aaab"', '"aaac"').replace("Ġt", "Ġq", 1))
    with pytest.raises(bpe.TokenizerError, match=r"tokenizer.json: content changed .* `dvc repro -f corpus`"):
        bpe.load_bpe(tmp_path, bpe.content_sha256(text))
    (tmp_path / "tokenizer.json").write_text(text)
    assert bpe.load_bpe(tmp_path, bpe.content_sha256(text)).get_vocab_size() == 600
    with pytest.raises(bpe.TokenizerError, match="is missing"):
        bpe.load_bpe(tmp_path / "nowhere", "0")
