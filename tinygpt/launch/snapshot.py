"""Code snapshots: the code a sweep's jobs run, frozen when they are submitted.

Jobs wait in the queue while their author keeps editing; a job that imports the checkout when it starts
runs whatever the checkout holds then. So at submission the tracked files as they are in the working tree
(HEAD plus uncommitted changes to tracked files; untracked files are left out, as `git stash` would) are
copied into `<workdir>/jobs/<sweep>/code/<digest>/`, named by a hash of their paths, modes and contents,
and the batch scripts put that folder first on PYTHONPATH. Launching unchanged code again reuses the
folder. A checkout that is not a git repository snapshots the package (`tinygpt/`, `launch.py`,
`pyproject.toml`). `SNAPSHOT.json` in the folder says what it holds; the trainer copies it into each
run's provenance.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tinygpt import durable

from .errors import LaunchError

RECORD = "SNAPSHOT.json"


@dataclass(frozen=True)
class Snapshot:
    path: Path
    digest: str
    commit: str | None
    dirty: bool | None
    files: int
    bytes: int
    reused: bool
    untracked: tuple[str, ...] = ()  # Python files git does not track (or ignore): left out, and said

    def record(self) -> dict:
        return {"snapshot": self.digest, "path": str(self.path), "commit": self.commit, "dirty": self.dirty}


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.decode("utf-8", "surrogateescape") if out.returncode == 0 else None


def source_files(root: Path) -> tuple[list[str], str | None, bool | None]:
    """(relative paths to copy, commit, dirty): git's tracked files, or the package without git."""
    listed = _git(root, "ls-files", "-z")  # (relative to root, also when root is inside a larger repository)
    if not listed:
        files = [str(p.relative_to(root)) for p in sorted((root / "tinygpt").rglob("*.py"))]
        files += [name for name in ("launch.py", "pyproject.toml") if (root / name).is_file()]
        return files, None, None
    commit = (_git(root, "rev-parse", "HEAD") or "").strip() or None
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    return [f for f in listed.split("\0") if f], commit, None if status is None else bool(status.strip())


def _contents(root: Path, files: list[str]) -> list[tuple[str, bytes, str]]:
    """(path, bytes, kind) of each file: kind "file", "exec" or "link" (bytes: where the link points); tracked
    files deleted from the tree are left out."""
    out = []
    for rel in files:
        path = root / rel
        try:
            if path.is_symlink():
                out.append((rel, os.readlink(path).encode("utf-8", "surrogateescape"), "link"))
            elif path.is_file():  # (not: deleted in the working tree, or a submodule's folder)
                out.append((rel, path.read_bytes(), "exec" if os.access(path, os.X_OK) else "file"))
        except OSError as err:
            raise LaunchError(f"code snapshot: cannot read {path} ({err.strerror}); fix it or launch with "
                              f"--no-snapshot") from None
    return out


def take(root: Path, dest_dir: Path) -> Snapshot:
    """Snapshot the code under `root` into `dest_dir/<digest>/` (or reuse the one there)."""
    files, commit, dirty = source_files(root)
    contents = _contents(root, files)
    digest = hashlib.sha256()
    for rel, data, kind in contents:
        digest.update(f"{rel}\0{len(data)}\0{kind}\0".encode("utf-8", "surrogateescape") + data)
    name = digest.hexdigest()[:16]
    target = dest_dir / name
    size = sum(len(data) for _, data, _ in contents)
    untracked = tuple(f for f in (_git(root, "ls-files", "-z", "--others", "--exclude-standard", "--", "*.py")
                                  or "").split("\0") if f)
    snap = Snapshot(target, name, commit, dirty, len(contents), size, (target / RECORD).is_file(), untracked)
    if snap.reused:
        return snap
    dest_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest_dir, prefix=durable.temp_prefix(target), suffix=durable.TEMP_SUFFIX))
    record = {"digest": name, "commit": commit, "dirty": dirty, "source": str(root), "files": len(contents),
              "bytes": size, "taken_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    record_file = (RECORD, (json.dumps(record, indent=1) + "\n").encode(), "file")
    for rel, data, kind in [*contents, record_file]:
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "link":
            path.symlink_to(data.decode("utf-8", "surrogateescape"))
            continue
        with open(path, "wb") as fh:  # each file on disk before the folder takes its name: a crash
            fh.write(data)            # never leaves a snapshot that would be reused with empty files
            os.fsync(fh.fileno())
        if kind == "exec":
            path.chmod(0o755)
    try:
        os.replace(tmp, target)
    except OSError:  # another launch made the same snapshot first: same digest, same files
        shutil.rmtree(tmp, ignore_errors=True)
    durable.fsync_dir(dest_dir)
    return snap

