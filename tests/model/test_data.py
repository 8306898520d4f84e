import json
import os

import numpy as np
import pytest
import torch

from tinygpt import data
from tinygpt.data import Batches, DataError


def test_prepare_writes_uint16_splits_and_meta(tiny_corpus, data_dir):
    prepared = data.prepare_from_config("shakespeare", str(tiny_corpus), str(data_dir))
    meta = json.loads((prepared.path / "meta.json").read_text())
    text = tiny_corpus.read_text()
    assert meta["sha256"] == data.sha256_text(text)
    assert meta["vocab"] == "".join(sorted(set(text)))
    train, val = prepared.tokens("train"), prepared.tokens("val")
    assert train.dtype == np.uint16
    assert len(train) + len(val) == len(text)
    assert len(val) == int(len(text) * 0.1)
    assert prepared.decode(np.concatenate([train, val])) == text  # first 90% train, last 10% val, in order


def test_prepare_is_skipped_when_fresh_and_redone_when_stale(tiny_corpus, data_dir):
    first = data.prepare_from_config("shakespeare", str(tiny_corpus), str(data_dir))
    stamp = (first.path / "train.bin").stat().st_mtime_ns
    again = data.prepare_from_config("shakespeare", str(tiny_corpus), str(data_dir))
    assert (again.path / "train.bin").stat().st_mtime_ns == stamp
    tiny_corpus.write_text(tiny_corpus.read_text() + "A NEW LINE WITH NEW LETTERS: qzx\n")
    third = data.prepare_from_config("shakespeare", str(tiny_corpus), str(data_dir))
    assert third.path == first.path
    assert third.meta["sha256"] != first.meta["sha256"] and "q" in third.vocab


def test_pydoc_corpus_is_built_in():
    text = data.pydoc_text()
    assert len(text) > 300_000 and "for" in text


def test_shakespeare_falls_back_to_pydoc_with_one_warning_when_offline(data_dir):
    warnings = []
    source = data.load_source("shakespeare", None, data_dir, warn=warnings.append)
    assert source.name == "pydoc"
    assert len(warnings) == 1 and "--data-file" in warnings[0] and "shakespeare/input.txt" in warnings[0]


def test_shakespeare_cache_is_checked_against_its_hash(data_dir):
    bad = data_dir / "shakespeare" / "input.txt"
    bad.parent.mkdir(parents=True)
    bad.write_text("not the play\n")
    with pytest.raises(DataError, match="does not match Tiny Shakespeare's sha256"):
        data.load_source("shakespeare", None, data_dir)


def test_shakespeare_download_is_verified(data_dir, monkeypatch):
    monkeypatch.delenv("TINYGPT_OFFLINE")
    monkeypatch.setattr(data, "_download", lambda url, timeout=0: b"tampered text\n")
    warnings = []
    source = data.load_source("shakespeare", None, data_dir, warn=warnings.append)
    assert source.name == "pydoc" and "sha256" in warnings[0]
    assert not (data_dir / "shakespeare" / "input.txt").exists()


def test_gutenberg_header_and_footer_are_stripped():
    raw = ("The Project Gutenberg eBook of X\nlicence blah\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\n"
           "Chapter 1\nThe book.\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\nmore licence\n")
    assert data.strip_gutenberg(raw) == "Chapter 1\nThe book.\n"


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "does not exist"),
        (b"", "is empty"),
        (b"  \n\n", "is empty"),
        (b"caf\xe9 latin-1", "is not UTF-8 text"),
    ],
)
def test_bad_data_files_are_clear_errors(tmp_path, content, message):
    path = tmp_path / "corpus.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DataError, match=message) as err:
        data.prepare_from_config("pydoc", str(path), str(tmp_path / "data"))
    assert "data_file" in str(err.value) and str(path) in str(err.value)


def test_block_size_longer_than_a_split_is_a_clear_error(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("abcdefghij" * 10)  # val split has 10 characters
    prepared = data.prepare_from_config("pydoc", str(path), str(tmp_path / "data"))
    with pytest.raises(DataError, match=r"block_size: the val split .* has only 10 characters.*at most 9"):
        Batches(prepared, block_size=16, batch_size=2, seed=0)


def test_batches_are_shifted_windows_and_resume_exactly(tiny_corpus, data_dir):
    prepared = data.prepare_from_config("pydoc", str(tiny_corpus), str(data_dir))
    batches = Batches(prepared, block_size=8, batch_size=4, seed=7)
    x, y = batches.next_train()
    assert x.shape == y.shape == (4, 8) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    saved = batches.state_dict()
    expected = [batches.next_train() for _ in range(3)]
    fresh = Batches(prepared, block_size=8, batch_size=4, seed=7)
    fresh.load_state_dict(saved)
    for (ex, ey), (gx, gy) in zip(expected, (fresh.next_train() for _ in range(3))):
        assert torch.equal(ex, gx) and torch.equal(ey, gy)


def test_ranks_draw_different_streams_and_eval_windows_are_fixed(tiny_corpus, data_dir):
    prepared = data.prepare_from_config("pydoc", str(tiny_corpus), str(data_dir))
    r0 = Batches(prepared, block_size=8, batch_size=4, seed=7, rank=0, eval_windows=10)
    r1 = Batches(prepared, block_size=8, batch_size=4, seed=7, rank=1, eval_windows=10)
    assert not torch.equal(r0.next_train()[0], r1.next_train()[0])
    first = [x for x, _ in r0.eval_batches("val")]
    r0.next_train()
    second = [x for x, _ in r0.eval_batches("val")]
    assert sum(len(x) for x in first) == 10
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_prepare_cli(tiny_corpus, tmp_path):
    from tests.support.processes import run_module

    out = run_module("tinygpt.data", "prepare", "--data-file", str(tiny_corpus), "--data-dir", str(tmp_path / "d"))
    assert out.returncode == 0, out.stderr
    assert "vocabulary" in out.stdout
    bad = run_module("tinygpt.data", "prepare", "--data-file", str(tmp_path / "missing.txt"))
    assert bad.returncode == 1 and "does not exist" in bad.stderr and "Traceback" not in bad.stderr


def test_prepare_leaves_no_temporary_files(tiny_corpus, data_dir):
    prepared = data.prepare_from_config("pydoc", str(tiny_corpus), str(data_dir))
    assert sorted(os.listdir(prepared.path)) == [".lock", "meta.json", "train.bin", "val.bin"]


def test_a_data_file_too_big_or_not_a_file_is_refused_before_it_is_read(tmp_path, monkeypatch):
    huge = tmp_path / "huge.txt"
    with open(huge, "wb") as fh:
        fh.truncate(data.MAX_TEXT_BYTES + 1)  # sparse: its size is all there is of it
    monkeypatch.setattr(type(huge), "read_bytes", lambda self: pytest.fail("read before the checks"))
    with pytest.raises(DataError, match=r"huge.txt is 2.0 GiB; a data file is read whole into memory, at most 2 GiB"):
        data.read_text_file(huge)
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(DataError, match="is not a regular file"):
        data.read_text_file(tmp_path / "pipe")


def test_more_distinct_characters_than_uint16_ids_count_is_a_clear_error(tmp_path):
    text = "".join(chr(c) for c in range(0x4E00, 0x4E00 + 70000) if not 0xD800 <= c < 0xE000)
    path = tmp_path / "many.txt"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match=f"holds {len(set(text)):,} distinct characters, more than the 65,536 that"):
        data.prepare_from_config("pydoc", str(path), str(tmp_path / "d"))


def test_prepare_works_on_a_filesystem_that_does_not_take_flock(tiny_corpus, data_dir, monkeypatch):
    """Some cluster filesystems answer flock with ENOLCK: the data is prepared all the same."""
    import errno

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(data.fcntl, "flock", no_locks)
    prepared = data.prepare_from_config("pydoc", str(tiny_corpus), str(data_dir))
    assert prepared.vocab_size == len(set(tiny_corpus.read_text()))
    assert data.prepare_from_config("pydoc", str(tiny_corpus), str(data_dir)).path == prepared.path
