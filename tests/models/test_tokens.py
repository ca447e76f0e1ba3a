"""Tests of topometrics.models.tokens: the character tokenizer and the one reader of prepared token files."""

import json

import numpy as np
import pytest

from topometrics.models.tokens import TokensError, decode, encode, load_tokens, token_file, tokens_sha256, vocabulary


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


def test_load_tokens_refuses_a_split_that_is_not_what_source_json_records(tmp_path):
    ids = encode("hello world, " * 20)
    ids.tofile(tmp_path / "train.u8")
    record = {"train_tokens": int(ids.size), "tokens_sha256": {"train": tokens_sha256(ids)}}
    (tmp_path / "source.json").write_text(json.dumps(record))
    np.testing.assert_array_equal(load_tokens(tmp_path, "train"), ids)
    ids[: ids.size // 2].tofile(tmp_path / "train.u8")  # truncated
    with pytest.raises(TokensError, match=r"train.u8: 130 tokens where source.json records 260 \(truncated or "):
        load_tokens(tmp_path, "train")
    changed = ids.copy()
    changed[7] ^= 1
    changed.tofile(tmp_path / "train.u8")
    with pytest.raises(TokensError, match=r"train.u8: content changed after the corpus stage wrote it \(sha256 .*"
                       r"run `dvc repro corpus` \(the corpus stage rewrites it\)$"):  # fmt: skip
        load_tokens(tmp_path, "train")
    (tmp_path / "source.json").write_text("{")
    with pytest.raises(TokensError, match=r"source.json is not valid JSON .*; run `dvc repro corpus`"):
        load_tokens(tmp_path, "train")


def test_a_prepared_corpus_decodes_with_the_tokenizer_that_made_it(tmp_path):
    from topometrics.models.tokens import decode_prepared
    from topometrics.params import TokenizerParams
    from topometrics.training.corpus import offline_text, prepare

    text = offline_text()[:40_000] + "\nnaïve 世界 🎉\n"
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    for tokenizer in (TokenizerParams("char"), TokenizerParams("bpe", 400)):
        out = tmp_path / tokenizer.kind
        prepare(str(tmp_path / "t.txt"), (), 1, 0.1, out, 16, 0.05, tokenizer)
        val = decode_prepared(out, load_tokens(out, "val"))
        assert val.endswith("naïve 世界 🎉\n" if tokenizer.kind == "bpe" else "na\ufffdve \ufffd\ufffd \ufffd\n")
        assert len(val) > 3_000
