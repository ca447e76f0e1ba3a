"""Corpus resolution: tokenizer, verified download from a local server, local text, offline fallback."""

import functools
import hashlib
import http.server
import io
import json
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.repo_params import repo_params
from topometrics.models.tokens import decode, encode
from topometrics.training import corpus
from topometrics.training.corpus import CorpusError, FallbackWarning, prepare, split_local, summary

# the repository's data.max_unknown_share and data.tokenizer (params.yaml: characters)
CHARS = (repo_params().data.max_unknown_share, repo_params().data.tokenizer)

REPO = Path(__file__).resolve().parents[2]

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "wikitext-2"


@pytest.mark.skipif(not SHARED.exists(), reason="../shared/data/wikitext-2 is absent on this machine")
def test_real_wikitext_round_trips_except_non_ascii():
    text = (SHARED / "wiki.valid.tokens").read_text(encoding="utf-8")
    ids = encode(text)
    ascii_mask = np.array([ord(c) < 127 for c in text])
    assert ids.size == len(text)
    assert (ids[~ascii_mask] == 127).all()
    assert decode(ids[ascii_mask]) == "".join(c for c in text if ord(c) < 127)


# ---------------------------------------------------------------- download against a local server


def make_archive(members: dict[str, str]) -> tuple[bytes, tuple[int, str], dict[str, tuple[int, str]]]:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, text in members.items():
            zf.writestr(name, text)
    blob = buf.getvalue()
    sums = {n: (len(t.encode()), hashlib.sha256(t.encode()).hexdigest()) for n, t in members.items()}
    return blob, (len(blob), hashlib.sha256(blob).hexdigest()), sums


@pytest.fixture
def server(tmp_path):
    """A loopback HTTP server over tmp_path/www; yields its base URL."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


MEMBERS = {
    "wikitext-2-raw/wiki.train.raw": " = Valkyria Chronicles = \n The game began development in 2010 .\n",
    "wikitext-2-raw/wiki.valid.raw": " = Robert Boulter = \n Robert Boulter is an English actor .\n",
}


def test_download_verifies_the_archive_and_members(server):
    root, base = server
    blob, expected, sums = make_archive(MEMBERS)
    (root / "w.zip").write_bytes(blob)
    got = corpus.fetch_wikitext((f"{base}/missing.zip", f"{base}/w.zip"), 5, expected, sums)
    assert got.train == MEMBERS["wikitext-2-raw/wiki.train.raw"]
    assert got.val == MEMBERS["wikitext-2-raw/wiki.valid.raw"]
    assert got.source["url"] == f"{base}/w.zip" and not got.source["fallback"]


def test_download_with_a_wrong_checksum_is_refused(server):
    root, base = server
    blob, (size, _), sums = make_archive(MEMBERS)
    (root / "w.zip").write_bytes(blob)
    with pytest.raises(CorpusError, match="SHA-256 .* does not match"):
        corpus.fetch_wikitext((f"{base}/w.zip",), 5, (size, "0" * 64), sums)
    tampered = dict(sums, **{"wikitext-2-raw/wiki.valid.raw": (1, "0" * 64)})
    with pytest.raises(CorpusError, match="member wikitext-2-raw/wiki.valid.raw fails"):
        corpus.fetch_wikitext((f"{base}/w.zip",), 5, (size, hashlib.sha256(blob).hexdigest()), tampered)


def test_the_published_wikitext_checksums_are_the_shared_readme_ones():
    if not SHARED.exists():
        pytest.skip("../shared/data/wikitext-2 is absent on this machine")
    readme = (SHARED / "README.md").read_text()
    assert corpus.WIKITEXT_ARCHIVE[1] in readme and f"{corpus.WIKITEXT_ARCHIVE[0]:,}" in readme
    for size, digest in corpus.WIKITEXT_MEMBERS.values():
        assert digest in readme and f"{size:,}" in readme


# ---------------------------------------------------------------- fallback, caching and local corpora


def test_unreachable_download_falls_back_loudly_and_is_cheap_when_cached(tmp_path):
    out = tmp_path / "corpus"
    with pytest.warns(FallbackWarning, match="OFFLINE FALLBACK"):
        first = prepare("wikitext-2-raw-v1", ("file:///nonexistent/w.zip",), 1, 0.1, out, 32, *CHARS)
    assert first["changed"] and first["fallback"] and first["used"] == corpus.FALLBACK
    source = json.loads((out / "source.json").read_text())
    assert source["requested"] == "wikitext-2-raw-v1" and "nonexistent" in source["reason"]
    assert np.fromfile(out / "train.u8", dtype=np.uint8).size == source["train_tokens"] > 100_000
    mtime = (out / "train.u8").stat().st_mtime_ns
    with pytest.warns(FallbackWarning):
        again = prepare("wikitext-2-raw-v1", (), 1, 0.1, out, 32, *CHARS)
    assert not again["changed"] and (out / "train.u8").stat().st_mtime_ns == mtime
    line, record = corpus.summary(again, out).splitlines()
    tokens = f"{source['train_tokens']:,} train / {source['val_tokens']:,} val tokens, 0.12% unknown characters"
    assert line == f"corpus: kept {out} ({corpus.FALLBACK}, {tokens}) FALLBACK: {source['reason']}"
    assert json.loads(record) == source  # the stage prints the record as written, without 'changed'


def test_wikitext_replaces_the_fallback_when_the_network_returns(tmp_path, server, monkeypatch):
    root, base = server
    blob, expected, sums = make_archive(MEMBERS)
    (root / "w.zip").write_bytes(blob)
    monkeypatch.setattr(corpus, "WIKITEXT_ARCHIVE", expected)
    monkeypatch.setattr(corpus, "WIKITEXT_MEMBERS", sums)
    out = tmp_path / "corpus"
    with pytest.warns(FallbackWarning):
        prepare("wikitext-2-raw-v1", (), 1, 0.1, out, 32, *CHARS)
    now = prepare("wikitext-2-raw-v1", (f"{base}/w.zip",), 5, 0.1, out, 32, *CHARS)
    assert now["changed"] and now["used"] == "wikitext-2-raw-v1" and not now["fallback"]
    assert decode(np.fromfile(out / "val.u8", dtype=np.uint8)) == MEMBERS["wikitext-2-raw/wiki.valid.raw"]
    assert not prepare("wikitext-2-raw-v1", (f"{base}/w.zip",), 5, 0.1, out, 32, *CHARS)["changed"]


def test_a_local_file_is_split_at_a_line_boundary(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("".join(f"line {i}\n" for i in range(100)))
    train, val = split_local(path, 0.1)
    assert train + val == path.read_text()
    assert val.startswith("line ") and train.endswith("\n")
    assert 0.08 < len(val) / len(train + val) < 0.12


def test_a_directory_with_train_and_valid_files_uses_them(tmp_path):
    (tmp_path / "wiki.train.raw").write_text("training text")
    (tmp_path / "wiki.valid.raw").write_text("validation text")
    assert split_local(tmp_path, 0.1) == ("training text", "validation text")


def test_bad_local_corpora_give_clear_errors(tmp_path):
    with pytest.raises(CorpusError, match="neither 'wikitext-2-raw-v1' nor an existing file"):
        split_local(tmp_path / "nope", 0.1)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(CorpusError, match="not UTF-8 text"):
        split_local(tmp_path / "latin1.txt", 0.1)


@pytest.mark.parametrize("text", ["", "x" * 50, "line\n" * 30])
def test_a_corpus_too_small_for_a_window_is_refused_and_the_previous_preparation_kept(tmp_path, text):
    good = tmp_path / "good.txt"
    good.write_text("".join(f"line {i} of a corpus long enough\n" for i in range(200)))
    out = tmp_path / "corpus"
    prepare(str(good), (), 1, 0.1, out, 32, *CHARS)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    small = tmp_path / "small.txt"
    small.write_text(text)
    with pytest.raises(CorpusError) as err:
        prepare(str(small), (), 1, 0.1, out, 32, *CHARS)
    message = str(err.value)
    assert message.startswith(f"data.corpus={str(small)!r} gives ") and "training and" in message
    assert "each split needs at least data.seq_len + 2 = 34" in message and "lower data.seq_len" in message
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.parametrize("damage", ["truncate", "flip", "record"])
def test_a_prepared_token_file_that_changed_is_named_and_rewritten(tmp_path, damage):
    good = tmp_path / "good.txt"
    good.write_text("".join(f"line {i} of a corpus long enough\n" for i in range(200)))
    out = tmp_path / "corpus"
    first = prepare(str(good), (), 1, 0.1, out, 32, *CHARS)
    assert first["tokens_sha256"]["train"] == hashlib.sha256((out / "train.u8").read_bytes()).hexdigest()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    if damage == "truncate":  # the stage used to report the half that was left as the corpus
        (out / "train.u8").write_bytes(before["train.u8"][: len(before["train.u8"]) // 2])
        named = f"{out / 'train.u8'}: 2,915 tokens where source.json records 5,830 (truncated or extended)"
    elif damage == "flip":
        (out / "val.u8").write_bytes(before["val.u8"][:-1] + b"X")
        named = f"{out / 'val.u8'}: content changed after the corpus stage wrote it (sha256 "
    else:
        (out / "source.json").write_text("[]")
        named = f"{out / 'source.json'}: not the corpus stage's record"
    again = prepare(str(good), (), 1, 0.1, out, 32, *CHARS)
    assert again["changed"] and again["redone"].startswith(named)
    assert summary(again, out).startswith(f"corpus: {named}")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_corpus_mostly_outside_the_tokenizers_range_is_refused_naming_the_share_the_range_and_the_fix(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("".join(f"line {i} of a corpus long enough\n" for i in range(200)))
    out = tmp_path / "corpus"
    kept = prepare(str(good), (), 1, 0.1, out, 32, max_unknown_share=0.05, tokenizer=CHARS[1])
    assert kept["unknown_share"] == 0.0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    cjk = tmp_path / "cjk.txt"  # valid UTF-8, almost no ASCII: nearly every character would become id 127
    cjk.write_text("".join(f"第{i}行的文本🙂很长很长很长\n" for i in range(300)))
    with pytest.raises(CorpusError) as err:
        prepare(str(cjk), (), 1, 0.1, out, 32, max_unknown_share=0.05, tokenizer=CHARS[1])
    assert str(err.value) == (
        f"data.corpus={str(cjk)!r}: 76.8% of its characters are outside the character tokenizer's range (ASCII "
        "0-126; every other character becomes the unknown id 127), above data.max_unknown_share=0.05; point "
        "data.corpus at mostly-ASCII text (e.g. English) or raise data.max_unknown_share"
    )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    lowered = prepare(str(good), (), 1, 0.1, out, 32, 0.0, CHARS[1])  # a kept preparation is checked too
    assert lowered["unknown_share"] == 0.0 and not lowered["changed"]


def test_a_record_written_before_token_hashes_gets_them_without_rewriting_the_tokens(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("".join(f"line {i} of a corpus long enough\n" for i in range(200)))
    out = tmp_path / "corpus"
    record = prepare(str(good), (), 1, 0.1, out, 32, *CHARS)
    recorded = json.loads((out / "source.json").read_text())
    legacy = {k: v for k, v in recorded.items() if k not in ("tokens_sha256", "unknown_share")}
    (out / "source.json").write_text(json.dumps(legacy))
    tokens = {p.name: p.read_bytes() for p in out.glob("*.u8")}
    again = prepare(str(good), (), 1, 0.1, out, 32, *CHARS)
    assert not again["changed"] and again["tokens_sha256"] == record["tokens_sha256"]
    assert json.loads((out / "source.json").read_text()) == recorded
    assert {p.name: p.read_bytes() for p in out.glob("*.u8")} == tokens


def test_a_directory_whose_train_file_is_shorter_than_a_window_is_refused(tmp_path):
    (tmp_path / "wiki.train.raw").write_text("x" * 50)
    (tmp_path / "wiki.valid.raw").write_text("y" * 500)
    with pytest.raises(CorpusError, match="gives 50 training and 500 validation characters"):
        prepare(str(tmp_path), (), 1, 0.1, tmp_path / "out", 64, *CHARS)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("corpus", ["empty.txt", "short.txt", "short-train"])
def test_dvc_repro_refuses_a_corpus_too_small_in_one_line_and_keeps_every_run(reproduced, corpus):
    import yaml

    from tests.pipeline.helpers import error_lines, failing, snapshot

    (reproduced / "empty.txt").write_text("")
    (reproduced / "short.txt").write_text("x" * 50)
    (reproduced / "short-train").mkdir()
    (reproduced / "short-train/wiki.train.raw").write_text("x" * 20)
    (reproduced / "short-train/wiki.valid.raw").write_text("line of validation text\n" * 100)
    before = snapshot(reproduced / "data")
    params = yaml.safe_load((reproduced / "params.yaml").read_text())
    params["data"]["corpus"] = corpus
    (reproduced / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = failing(["dvc", "repro"], reproduced)
    sizes = {"empty.txt": "0 training and 0", "short.txt": "45 training and 5", "short-train": "20 training and 2,400"}
    assert error_lines(out) == [
        f"error: data.corpus='{corpus}' gives {sizes[corpus]} validation characters; each split needs at least "
        "data.seq_len + 2 = 34; point data.corpus at more text or lower data.seq_len"
    ]
    assert snapshot(reproduced / "data") == before  # no run, corpus or warehouse file lost or changed


# ---------------------------------------------------------------- data.tokenizer: a byte-level BPE


def bpe_corpus(tmp_path: Path) -> Path:
    """A local corpus whose validation split holds a word the training split never has."""
    folder = tmp_path / "text"
    folder.mkdir()
    english = corpus.offline_text()[:60_000]
    (folder / "wiki.train.raw").write_text(english, encoding="utf-8")
    (folder / "wiki.valid.raw").write_text(("zqxv zqxv 世界 🎉 " * 400) + english[:8_000], encoding="utf-8")
    return folder


def test_a_bpe_corpus_is_trained_on_the_training_split_and_stored_as_uint16(tmp_path):
    from topometrics.models import bpe
    from topometrics.models.tokens import load_tokens, vocab_size
    from topometrics.params import TokenizerParams

    text, out = bpe_corpus(tmp_path), tmp_path / "prepared"
    source = prepare(str(text), (), 1, 0.1, out, 32, 0.05, TokenizerParams("bpe", 1000))
    tok = bpe.load_bpe(out, source["tokenizer"]["sha256"])
    assert vocab_size(source) == tok.get_vocab_size() == 1000 and source["tokenizer"]["requested"] == 1000
    assert not (out / "train.u8").exists() and load_tokens(out, "val").dtype == np.uint16
    assert not any("zq" in symbol for symbol in tok.get_vocab())  # the validation-only word made no merge
    val = (text / "wiki.valid.raw").read_text(encoding="utf-8")
    assert bpe.decode(tok, load_tokens(out, "val")) == val and source["val_bytes"] == len(val.encode("utf-8"))
    assert source["unknown_share"] == 0.0 and len(json.loads((out / "vocab.json").read_text())) == 1000
    line = summary(source, out).splitlines()[0]
    assert f"byte-level BPE of 1,000 tokens, trained in {source['tokenizer']['train_s']:.1f} s" in line
    assert not prepare(str(text), (), 1, 0.1, out, 32, 0.05, TokenizerParams("bpe", 1000))["changed"]


def test_a_bpe_vocabulary_the_text_cannot_fill_is_capped_with_a_warning(tmp_path):
    from topometrics.models.tokens import load_tokens
    from topometrics.params import TokenizerParams

    folder = tmp_path / "text"
    folder.mkdir()
    (folder / "a.train.txt").write_text("abcabd abcabd\n" * 50)
    (folder / "a.valid.txt").write_text("abd abc abd\n" * 20)
    with pytest.warns(corpus.CappedVocabularyWarning, match=r"vocab_size=4,000 is more .* capped at 2\d\d tokens"):
        source = prepare(str(folder), (), 1, 0.1, tmp_path / "out", 8, 0.05, TokenizerParams("bpe", 4000))
    assert source["tokenizer"]["vocab_size"] == 261  # 256 bytes + 5 merges: ab, cab, abcab, abcabd, Ġabcabd
    assert load_tokens(tmp_path / "out", "val").dtype == np.uint16  # a BPE always has more than 256 ids
    assert "(capped from 4,000)" in summary(source, tmp_path / "out")


def test_switching_the_tokenizer_or_editing_tokenizer_json_redoes_the_preparation(tmp_path):
    from topometrics.models.tokens import load_tokens
    from topometrics.params import TokenizerParams

    text, out = bpe_corpus(tmp_path), tmp_path / "prepared"
    chars = prepare(str(text), (), 1, 0.1, out, 32, *CHARS)
    assert "tokenizer" not in chars and (out / "train.u8").exists()
    bpe_source = prepare(str(text), (), 1, 0.1, out, 32, 0.05, TokenizerParams("bpe", 600))
    assert bpe_source["redone"].endswith("made with another data.tokenizer") and not (out / "train.u8").exists()
    tokenizer_json = out / "tokenizer.json"
    tokenizer_json.write_text(tokenizer_json.read_text().replace("Ġt", "Ġq", 1))
    again = prepare(str(text), (), 1, 0.1, out, 32, 0.05, TokenizerParams("bpe", 600))
    assert again["changed"] and "tokenizer.json: content changed" in again["redone"]
    back = prepare(str(text), (), 1, 0.1, out, 32, *CHARS)
    assert "tokenizer" not in back and not tokenizer_json.exists() and not (out / "val.u16").exists()
    assert (load_tokens(out, "val") == encode((text / "wiki.valid.raw").read_text())).all()
