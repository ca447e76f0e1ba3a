"""Tests of topometrics.models.tokens: the character tokenizer and the one reader of prepared token files."""

import numpy as np
import pytest

from topometrics.models.tokens import decode, encode, load_tokens, token_file, vocabulary


def test_ascii_text_round_trips():
    text = "The quick brown fox = 3.14 ; \n\t{ascii} ~"
    ids = encode(text)
    assert ids.dtype == np.uint8 and ids.size == len(text)
    assert decode(ids) == text


def test_non_ascii_characters_map_to_the_reserved_id():
    ids = encode("café — ∑\x7f")
    assert ids.tolist() == [99, 97, 102, 127, 32, 127, 32, 127, 127]
    assert decode(ids) == "caf\ufffd \ufffd \ufffd\ufffd"
    assert len(vocabulary()) == 128


def test_load_tokens_reads_what_was_written_and_names_a_missing_file(tmp_path):
    ids = encode("hello\nworld")
    ids.tofile(tmp_path / "val.u8")
    np.testing.assert_array_equal(load_tokens(tmp_path, "val"), ids)
    assert token_file(tmp_path, "train") == tmp_path / "train.u8"
    with pytest.raises(FileNotFoundError, match=r"train.u8 is missing; run the corpus stage first"):
        load_tokens(tmp_path, "train")
    with pytest.raises(ValueError, match="split must be one of"):
        token_file(tmp_path, "test")
