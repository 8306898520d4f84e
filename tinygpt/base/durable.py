"""Writing a file so that a crash at any moment leaves either the old file or the whole new one.

The new contents go to a temporary file with a unique name in the same folder (a rename across
filesystems is not atomic), which is flushed and fsynced; it is then renamed over the target (atomic on
POSIX), and the folder is fsynced so that the rename itself survives a power cut. Every file tinygpt
writes in place goes through here. A record that only grows (a sweep's submissions) is appended instead
(`append_line`): a crash then loses at most the line being written. Standard library only: the launcher uses it
too.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

TEMP_SUFFIX = ".tmp"
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def temp_prefix(path: Path) -> str:
    """How the temporary file of a write to `path` starts (hidden, so no reader takes it for the file)."""
    return f".{path.name}."


@contextlib.contextmanager
def replacing(path: str | Path, mode: str = "wb", sync_dir: bool = True) -> Iterator[IO]:
    """A new file to write that takes `path`'s place, whole, when the block ends without an error; on an
    error the temporary file is removed and `path` is as it was. `sync_dir=False` leaves the folder's fsync
    to the caller (one for many files)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=temp_prefix(path), suffix=TEMP_SUFFIX)
    os.fchmod(fd, 0o666 & ~_UMASK)  # (mkstemp's file is private: the file it replaces was not)
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(err, OSError) and err.filename is None:  # (a failed write names no file: say which)
            raise OSError(err.errno, err.strerror, str(path)) from None
        raise
    if sync_dir:
        fsync_dir(path.parent)


def write(path: str | Path, data: str | bytes, executable: bool = False) -> None:
    """Replace `path` with `data` (text is written as UTF-8); `executable`: a script its owner may run (and whom
    the umask lets, as for any file made)."""
    with replacing(path, "wb") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)
        if executable:
            os.fchmod(fh.fileno(), 0o777 & ~_UMASK)


def append_line(path: str | Path, line: str) -> None:
    """Add `line` to the end of `path` (made if missing) and fsync it: an earlier record is never rewritten, and a
    crash loses at most this one. A last line cut short by an earlier crash is ended first, so that it stays one
    damaged line (which its reader names) and does not swallow this one."""
    path = Path(path)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        size = os.fstat(fd).st_size
        cut_short = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
        data = memoryview(("\n" if cut_short else "").encode() + line.encode() + b"\n")
        while data:  # (a write may take part of it: a signal, a full disk, which the next write then raises)
            data = data[os.write(fd, data):]
        os.fsync(fd)
    finally:
        os.close(fd)
    if size == 0:
        fsync_dir(path.parent)  # (the file's name is new: make it durable too)


def set_aside(path: Path) -> Path:
    """Rename a damaged file to `<name>.corrupt` (`.corrupt.1`, ... when that is taken), never deleting or
    overwriting anything; returns the new path."""
    target, n = path.with_name(path.name + ".corrupt"), 1
    while target.exists():
        target, n = path.with_name(f"{path.name}.corrupt.{n}"), n + 1
    os.replace(path, target)
    return target


def fsync_dir(folder: str | Path) -> None:
    """Make a rename in `folder` durable. Some filesystems cannot fsync a folder; there the rename is as
    durable as that filesystem makes it, and nothing is lost by going on."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
