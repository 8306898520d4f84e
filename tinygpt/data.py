"""Corpora, the character vocabulary, prepared token files and batches.

    text ──prepare──> <data_dir>/<name>/{train.bin, val.bin, meta.json}   (uint16 ids, first 90% / last 10%)
                          │ np.memmap, read-only
                          v
    Batches: random windows x = ids[i : i+T], y = ids[i+1 : i+T+1], drawn by a seeded torch.Generator
    whose state goes into every checkpoint; evaluation uses fixed windows so losses compare across
    steps, runs and resumes.

`meta.json` is written last and atomically, so its presence means the .bin files beside it are whole.
Preparation happens only when the files are missing or stale (the text's sha256 decides), under a file
lock, so many ranks or array tasks can ask for it at once.

Command line: `python -m tinygpt.data prepare NAME [--data-file PATH] [--data-dir DIR]`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import stat
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tinygpt.base import durable

SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
SHERLOCK_URL = "https://www.gutenberg.org/cache/epub/1661/pg1661.txt"
DOWNLOAD_TIMEOUT_S = 10.0
VAL_FRACTION = 0.1
FORMAT_VERSION = 1


class DataError(RuntimeError):
    """A problem with the training text, reported to the user without a traceback."""


def default_data_dir() -> Path:
    return Path(os.environ.get("TINYGPT_DATA_DIR") or "data")


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ----------------------------------------------------------------------------------------------------
# Sources


def _download(url: str, timeout: float = DOWNLOAD_TIMEOUT_S) -> bytes:
    if os.environ.get("TINYGPT_OFFLINE"):
        raise OSError("TINYGPT_OFFLINE is set")
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (fixed https URLs)
        return response.read()


def pydoc_text() -> str:
    """The English text of Python's own documentation topics: on every Python install, no network."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key].strip() for key in sorted(topics)) + "\n"


def shakespeare_text(data_dir: Path) -> str:
    """Tiny Shakespeare from the cache, else downloaded and checked; raises OSError when unavailable."""
    cached = data_dir / "shakespeare" / "input.txt"
    if cached.exists():
        raw = cached.read_bytes()
        if hashlib.sha256(raw).hexdigest() == SHAKESPEARE_SHA256:
            return raw.decode("utf-8")
        raise DataError(
            f"{cached}: does not match Tiny Shakespeare's sha256 {SHAKESPEARE_SHA256}; "
            f"delete it to download again, or train on it with --data-file {cached}"
        )
    raw = _download(SHAKESPEARE_URL)
    digest = hashlib.sha256(raw).hexdigest()
    if digest != SHAKESPEARE_SHA256:
        raise OSError(f"downloaded Tiny Shakespeare has sha256 {digest}, expected {SHAKESPEARE_SHA256}")
    durable.write(cached, raw)
    return raw.decode("utf-8")


def strip_gutenberg(text: str) -> str:
    """Drop Project Gutenberg's header and licence footer, keeping the book."""
    start = re.search(r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG EBOOK.*$", text, re.M | re.I)
    end = re.search(r"^\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG EBOOK.*$", text, re.M | re.I)
    body = text[start.end() if start else 0 : end.start() if end else len(text)]
    return body.strip() + "\n"


def sherlock_text(data_dir: Path) -> str:
    """The Adventures of Sherlock Holmes (Gutenberg #1661), cached after the first download."""
    cached = data_dir / "sherlock" / "input.txt"
    if cached.exists():
        try:
            return cached.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise DataError(f"{cached}: is not UTF-8 text (damaged); delete it to download it again") from None
    raw = _download(SHERLOCK_URL).decode("utf-8-sig").replace("\r\n", "\n")
    text = strip_gutenberg(raw)
    durable.write(cached, text.encode("utf-8"))
    return text


MAX_TEXT_BYTES = 2**31  # a data file is read whole into memory, and its characters become uint16 ids


def read_text_file(path: str | Path) -> str:
    """A UTF-8 text file, whole; what it is and how big is checked before anything is read."""
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise DataError(
            f"data_file: {path} does not exist; check the path (relative paths start at {Path.cwd()})"
        ) from None
    except OSError as err:
        raise DataError(f"data_file: cannot read {path}: {err.strerror}") from None
    except ValueError:  # a NUL character
        raise DataError(f"data_file: {str(path)!r} holds a NUL character; give a file path") from None
    if stat.S_ISDIR(info.st_mode):
        raise DataError(f"data_file: {path} is a directory; give a UTF-8 text file")
    if not stat.S_ISREG(info.st_mode):
        raise DataError(f"data_file: {path} is not a regular file (a device, pipe or socket); give a UTF-8 text file")
    if info.st_size > MAX_TEXT_BYTES:
        raise DataError(f"data_file: {path} is {info.st_size / 2**30:.1f} GiB; a data file is read whole into "
                        f"memory, at most {MAX_TEXT_BYTES // 2**30} GiB: train on a part of it")
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise DataError(f"data_file: cannot read {path}: {err.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            f"data_file: {path} is not UTF-8 text (byte {err.start}); convert it, e.g. "
            f"`iconv -f latin1 -t utf-8 {path} > {path.stem}.utf8.txt`"
        ) from None
    if not text.strip():
        raise DataError(f"data_file: {path} is empty; give a file with text in it")
    return text


@dataclass(frozen=True)
class Source:
    name: str  # folder name under data_dir
    label: str  # human description, recorded in meta.json
    text: str


def load_source(dataset: str, data_file: str | None, data_dir: Path, warn=None) -> Source:
    """The text to train on. `shakespeare` falls back to `pydoc`, with one warning, when offline."""
    if data_file is not None:
        path = Path(data_file).expanduser()
        text = read_text_file(path)
        key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:10]
        safe_stem = re.sub(r"[^A-Za-z0-9_.-]", "_", path.stem)[:40] or "file"
        return Source(f"file-{safe_stem}-{key}", str(path.resolve()), text)
    if dataset == "pydoc":
        return Source("pydoc", "pydoc_data.topics (built-in)", pydoc_text())
    if dataset == "shakespeare":
        try:
            return Source("shakespeare", SHAKESPEARE_URL, shakespeare_text(data_dir))
        except OSError as err:
            (warn or _warn)(
                f"Tiny Shakespeare is not available ({err}); training on the built-in pydoc corpus instead. "
                f"To use it offline, copy input.txt to {data_dir / 'shakespeare' / 'input.txt'} "
                f"or pass --data-file PATH."
            )
            return Source("pydoc", "pydoc_data.topics (built-in)", pydoc_text())
    if dataset == "sherlock":
        try:
            return Source("sherlock", SHERLOCK_URL, sherlock_text(data_dir))
        except OSError as err:
            raise DataError(
                f"dataset: sherlock could not be downloaded ({err}); put the plain-text book at "
                f"{data_dir / 'sherlock' / 'input.txt'} or pass --data-file PATH"
            ) from None
    raise DataError(f"dataset: unknown dataset {dataset!r}; choose shakespeare, pydoc or sherlock")


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------------
# Preparation


@dataclass(frozen=True)
class Prepared:
    path: Path  # the folder with train.bin, val.bin, meta.json
    meta: dict

    @property
    def vocab(self) -> str:
        return self.meta["vocab"]

    @property
    def vocab_size(self) -> int:
        return len(self.meta["vocab"])

    def encode(self, text: str) -> list[int]:
        stoi = {ch: i for i, ch in enumerate(self.vocab)}
        unknown = sorted({ch for ch in text if ch not in stoi})
        if unknown:
            raise DataError(f"characters not in this corpus's vocabulary: {''.join(unknown)!r}")
        return [stoi[ch] for ch in text]

    def decode(self, ids) -> str:
        vocab = self.vocab
        return "".join(vocab[int(i)] for i in ids)

    def tokens(self, split: str) -> np.memmap:
        return np.memmap(self.path / f"{split}.bin", dtype=np.uint16, mode="r")


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """One preparer at a time, where the filesystem takes flock. Where it does not (ENOLCK, EOPNOTSUPP: some
    cluster filesystems), preparers may overlap, which costs time only: each file is written whole under a
    temporary name and renamed (durable.write), and meta.json, which makes the folder count, comes last."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX)
        except OSError as err:
            if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP):
                raise
            yield
            return
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _fresh(folder: Path, digest: str) -> dict | None:
    try:
        meta = json.loads((folder / "meta.json").read_bytes())
        if meta.get("sha256") != digest or meta.get("format") != FORMAT_VERSION:
            return None
        for split in ("train", "val"):
            f = folder / f"{split}.bin"
            if not f.exists() or f.stat().st_size != 2 * meta["split"][split]:
                return None
    except (OSError, ValueError, AttributeError, KeyError, TypeError):  # (damaged: prepared again)
        return None
    return meta


def prepare(source: Source, data_dir: Path) -> Prepared:
    """Write (or reuse) the token files of `source` under `data_dir/source.name`."""
    folder = data_dir / source.name
    digest = sha256_text(source.text)
    meta = _fresh(folder, digest)
    if meta is not None:
        return Prepared(folder, meta)
    with _locked(folder):
        meta = _fresh(folder, digest)  # another process may have finished while we waited
        if meta is not None:
            return Prepared(folder, meta)
        vocab = "".join(sorted(set(source.text)))
        if len(vocab) > np.iinfo(np.uint16).max + 1:
            raise DataError(f"data_file: {source.label} holds {len(vocab):,} distinct characters, more than the "
                            f"{np.iinfo(np.uint16).max + 1:,} that uint16 token ids can count; give a text with "
                            f"fewer distinct characters")
        lut = {ch: i for i, ch in enumerate(vocab)}
        ids = np.fromiter((lut[ch] for ch in source.text), dtype=np.uint16, count=len(source.text))
        n_val = int(len(ids) * VAL_FRACTION)
        train, val = ids[: len(ids) - n_val], ids[len(ids) - n_val :]
        durable.write(folder / "train.bin", train.tobytes())
        durable.write(folder / "val.bin", val.tobytes())
        meta = {
            "format": FORMAT_VERSION,
            "source": source.label,
            "name": source.name,
            "sha256": digest,
            "n_chars": len(source.text),
            "vocab": vocab,
            "split": {"train": int(len(train)), "val": int(len(val)), "val_fraction": VAL_FRACTION},
        }
        durable.write(folder / "meta.json", json.dumps(meta, indent=1, ensure_ascii=False).encode("utf-8"))
        return Prepared(folder, meta)


def prepare_from_config(dataset: str, data_file: str | None, data_dir: str | None, warn=None) -> Prepared:
    if data_dir and "\x00" in data_dir:
        raise DataError(f"data_dir: {data_dir!r} holds a NUL character; give a directory path")
    try:
        root = Path(data_dir).expanduser() if data_dir else default_data_dir()
    except RuntimeError:  # ~user of no user here
        raise DataError(f"data_dir: {data_dir!r}: no such user to expand ~ for; give a full path") from None
    source = load_source(dataset, data_file, root, warn)
    try:
        return prepare(source, root)
    except OSError as err:
        raise DataError(f"data_dir: cannot write the prepared data under {str(root)[:200]!r} "
                        f"({err.strerror or err}); give a directory you can write to") from None


# ----------------------------------------------------------------------------------------------------
# Batches


class Batches:
    """Random training windows from a memory map, and fixed evaluation windows.

    Each rank has its own generator (seeded from the run's seed and the rank), so ranks see different
    data; its state is part of the checkpoint, so a resumed run draws exactly the windows it would have.
    """

    def __init__(self, prepared: Prepared, block_size: int, batch_size: int, seed: int, rank: int = 0,
                 eval_windows: int = 240):
        import torch

        self.block_size = block_size
        self.batch_size = batch_size
        self.train = prepared.tokens("train")
        self.val = prepared.tokens("val")
        for split, arr in (("train", self.train), ("val", self.val)):
            if len(arr) < block_size + 1:
                raise DataError(
                    f"block_size: the {split} split of {prepared.meta['source']} has only {len(arr)} "
                    f"characters, fewer than block_size + 1 = {block_size + 1}; lower block_size "
                    f"(at most {len(arr) - 1}) or use a longer text"
                )
        self.generator = torch.Generator().manual_seed(seed * 1000 + rank)
        self._window = torch.arange(block_size + 1)
        self._fixed = {split: self._fixed_offsets(len(arr), eval_windows)
                       for split, arr in (("train", self.train), ("val", self.val))}

    def _fixed_offsets(self, n: int, count: int):
        import torch

        last = n - self.block_size - 1
        return torch.linspace(0, last, steps=min(count, last + 1)).round().long().unique()

    def windows(self, split: str, offsets):
        """(x, y) of the windows of `split` ("train" or "val") that start at `offsets` (1-D int64)."""
        import torch

        arr = self.train if split == "train" else self.val
        index = (offsets[:, None] + self._window).numpy()  # (B, T+1), no Python loop
        chunk = torch.from_numpy(arr[index].astype(np.int64))
        return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()

    def next_train(self):
        """(x, y), each (batch_size, block_size) int64."""
        import torch

        offsets = torch.randint(len(self.train) - self.block_size, (self.batch_size,), generator=self.generator)
        return self.windows("train", offsets)

    def eval_batches(self, split: str):
        """Fixed windows of `split`, in batches of batch_size: identical at every call."""
        offsets = self._fixed[split]
        for i in range(0, len(offsets), self.batch_size):
            yield self.windows(split, offsets[i : i + self.batch_size])

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])


# ----------------------------------------------------------------------------------------------------
# Command line


def parser():
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tinygpt.data", description="Prepare training data.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="write train.bin, val.bin and meta.json (only when missing or stale)")
    p.add_argument("name", nargs="?", default="shakespeare", help="shakespeare, pydoc or sherlock")
    p.add_argument("--data-file", help="any UTF-8 text file instead of a named corpus")
    p.add_argument("--data-dir", help="where to write (default: $TINYGPT_DATA_DIR, else ./data)")
    return parser


def main(argv: list[str] | None = None) -> int:
    import argparse

    from tinygpt.base.errors import blank_arguments, not_utf8

    argv = sys.argv[1:] if argv is None else argv
    top = parser()
    if problems := not_utf8(argv):
        top.error("; ".join(problems))
    args = top.parse_args(argv)
    if args.data_file is None and args.name not in ("shakespeare", "pydoc", "sherlock"):
        top.error(f"unknown corpus {args.name!r}; choose shakespeare, pydoc or sherlock, or give --data-file")
    prepare = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices["prepare"]
    if problems := blank_arguments(prepare._actions, args):
        top.error("; ".join(problems))
    try:
        prepared = prepare_from_config(args.name, args.data_file, args.data_dir)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    meta = prepared.meta
    print(
        f"{prepared.path}: {meta['n_chars']:,} characters, vocabulary {len(meta['vocab'])}, "
        f"train {meta['split']['train']:,} / val {meta['split']['val']:,} (source: {meta['source']})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
