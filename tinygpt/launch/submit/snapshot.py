"""Code snapshots: the code a sweep's jobs run, frozen when they are submitted.

Jobs wait in the queue while their author keeps editing; a job that imports the checkout when it starts
runs whatever the checkout holds then. So at submission the tracked files as they are in the working tree
(HEAD plus uncommitted changes to tracked files; untracked files are left out, as `git stash` would) are
copied into `<workdir>/jobs/<sweep>/code/<digest>/`, named by a hash of their paths, modes and contents,
and the batch scripts put that folder first on PYTHONPATH. Launching unchanged code again reuses the
folder; a changed checkout makes a new one that shares its unchanged files with the earlier ones (hard
links into `code/.objects/`, each content stored once). Only what is inside the repository is taken: a link
that points outside is copied as the file it points to, and a tracked file over `snapshot_max_file_mb`
(10 MB) is refused at launch. A checkout that is not a git repository snapshots the package (every file of
`tinygpt/` but caches, `launch.py`, `pyproject.toml`). `SNAPSHOT.json` in the folder says what it holds; the
trainer copies it into each run's provenance.json.
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

from tinygpt.base import durable
from tinygpt.launch.errors import LaunchError
from tinygpt.launch.spec.command import path_in

RECORD = "SNAPSHOT.json"
OBJECTS = ".objects"  # under the sweep's code/: each file content once, which the snapshots hard-link
MAX_FILE_BYTES = 10_000_000  # a tracked file larger than this is refused (`snapshot_max_file_mb` in a spec)


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
    left_out: tuple[LeftOut, ...] = ()  # a user's project: what is in its folder and not in the snapshot
    identity: str = ""  # the digest of its files but the spec's own: what a relaunch's code_counts compares

    def record(self) -> dict:
        return {"snapshot": self.digest, "path": str(self.path), "commit": self.commit, "dirty": self.dirty}


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.decode("utf-8", "surrogateescape") if out.returncode == 0 else None


SWEEP_FOLDERS = ("jobs", "runs", "logs")  # (at a project's top without git: what sweeps launched there write)
CACHE = "__pycache__"


@dataclass(frozen=True)
class LeftOut:
    """A file or folder of a user's project that the snapshot does not hold, and how much it holds."""

    path: str  # relative to the project; a folder ends with /
    files: int
    bytes: int


def source_files(root: Path, everything: bool = False) -> tuple[list[str], str | None, bool | None]:
    """(relative paths to copy, commit, dirty): git's tracked files; without git (dirty is None), the package (or
    `everything` under `root`: a user's project, less hidden files, virtual environments, caches and the
    SWEEP_FOLDERS at its top)."""
    listed = _git(root, "ls-files", "-z")  # (relative to root, also when root is inside a larger repository)
    if not listed and everything:
        return [str(p.relative_to(root)) for p in sorted(root.rglob("*"))
                if (p.is_file() or p.is_symlink()) and not _skipped(root, p)], None, None
    if not listed:  # (every file of the package, as pip laid it out: its scripts and data too, not only *.py)
        files = [str(p.relative_to(root)) for p in sorted((root / "tinygpt").rglob("*"))
                 if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")]
        files += [name for name in ("launch.py", "pyproject.toml") if (root / name).is_file()]
        return files, None, None
    commit = (_git(root, "rev-parse", "HEAD") or "").strip() or None
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    return [f for f in listed.split("\0") if f], commit, None if status is None else bool(status.strip())


def _skipped(root: Path, path: Path) -> bool:
    """Not a project's own file when it is no git work tree: hidden, a cache, in a virtual environment, or in a
    folder that sweeps launched at its top write."""
    parts = path.relative_to(root).parts
    return (any(part.startswith(".") or part == CACHE for part in parts) or parts[0] in SWEEP_FOLDERS
            or any((parent / "pyvenv.cfg").is_file() for parent in path.parents if root in parent.parents))


def _with_included(root: Path, files: list[str], include: tuple[str, ...]) -> list[str]:
    """`files` and the files under `root` that the `include` globs match (each once, in order)."""
    extra = [str(p.relative_to(root)) for pattern in include for p in sorted(root.glob(pattern)) if p.is_file()
             and ".git" not in p.relative_to(root).parts]
    return list(dict.fromkeys([*files, *extra]))


def unheld_words(root: Path, argv: list[str], include: tuple[str, ...]) -> list[str]:
    """The words of a program's argv that name a file of the project that its snapshot will not hold (untracked,
    or ignored, by git), or a program in it that cannot run (no run bit): every task would fail on it. A word is
    a path relative to the project, or the value of an `--option=path` word."""
    if not root.is_dir():
        return []  # (spec/command.py says so)
    held = set(_with_included(root, source_files(root, True)[0], include))
    problems = []
    for i, word in enumerate(argv):
        path = path_in(word)
        if not path or "{" in path or Path(path).is_absolute() or not (root / path).is_file():
            continue
        rel = os.path.relpath(os.path.realpath(root / path), os.path.realpath(root))
        if rel.startswith(".."):
            continue  # (outside the project: spec/command.py's check)
        if rel not in held:
            problems.append(f"command.argv[{i}]: {path} is in the project but not in its snapshot, as git does not "
                            f"track it; `git add` it, or take it with command.include: [{rel}]")
        elif i == 0 and "/" in path and not os.access(root / path, os.X_OK):
            problems.append(f"command.argv[0]: {path} cannot be run (no run bit: chmod +x {path}), or start it with "
                            f"its interpreter, e.g. [python, {path}, ...]")
    return problems


def left_out(root: Path, taken: set[str], most: int = 8) -> tuple[LeftOut, ...]:
    """The largest files and folders of a user's git work tree that a snapshot of `taken` does not hold: git's
    untracked and ignored ones, less hidden ones, caches, virtual environments and the SWEEP_FOLDERS at its top,
    the `most` largest first. (Without git a snapshot holds every file but those.)"""
    listed = _git(root, "ls-files", "-z", "--others", "--directory")  # (untracked and ignored; folders whole)
    found = []
    for entry in (e for e in (listed or "").split("\0") if e):
        path, top = root / entry, entry.split("/")[0]
        if top.startswith(".") or top in SWEEP_FOLDERS or CACHE in Path(entry).parts or (path / "pyvenv.cfg").is_file():
            continue
        files = [p for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file() and not p.is_symlink()
                 and str(p.relative_to(root)) not in taken]
        if files:
            name = entry.rstrip("/") + ("/" if path.is_dir() else "")
            found.append(LeftOut(name, len(files), sum(p.stat().st_size for p in files)))
    return tuple(sorted(found, key=lambda e: -e.bytes)[:most])


def _contents(root: Path, files: list[str], max_file_bytes: int, tracked: frozenset[str] = frozenset()
              ) -> list[tuple[str, bytes, str]]:
    """(path, bytes, kind) of each file: kind "file", "exec" or "link" (bytes: where the link points); tracked
    files deleted from the tree are left out. A link stays a link when it points inside the repository; one
    that points outside is copied as the file it points to (the jobs must not run what that file becomes),
    and one to a folder or to nothing outside is refused. A file over `max_file_bytes` is refused."""
    real_root = root.resolve()
    out = []
    for rel in files:
        path = root / rel
        try:
            if path.is_symlink():
                target = Path(os.path.realpath(path))
                if target == real_root or real_root in target.parents:
                    out.append((rel, _inside_link(path, rel, real_root, target), "link"))
                    continue
                if not target.is_file():
                    raise LaunchError(f"code snapshot: {rel} is a link to {os.readlink(path)}, outside the repository "
                                      f"and not a file, so the jobs could not be given what it holds; make it a file "
                                      f"or a link inside the repository, or launch with --no-snapshot")
            if path.is_file():  # (not: deleted in the working tree, or a submodule's folder)
                if path.stat().st_size > max_file_bytes:
                    away = (f"untrack it (git rm --cached {rel})" if rel in tracked else "move it out of the folder, "
                            "or out of command.include, and give its absolute path (it stays where it is, on the "
                            "cluster's shared file system)")
                    raise LaunchError(f"code snapshot: {rel} is {path.stat().st_size / 1e6:.1f} MB, over the "
                                      f"{max_file_bytes / 1e6:g} MB a snapshot copies of one file; {away}, raise "
                                      f"`snapshot_max_file_mb` in the spec, or launch with --no-snapshot")
                out.append((rel, path.read_bytes(), "exec" if os.access(path, os.X_OK) else "file"))
        except OSError as err:
            raise LaunchError(f"code snapshot: cannot read {path} ({err.strerror}); fix it or launch with "
                              f"--no-snapshot") from None
    return out


def _inside_link(path: Path, rel: str, real_root: Path, target: Path) -> bytes:
    """Where a link inside the repository points, relative to itself (an absolute link would point at the live
    checkout, not at the snapshot)."""
    link = os.readlink(path)
    if not os.path.isabs(link):
        return link.encode("utf-8", "surrogateescape")
    return os.path.relpath(target, (real_root / rel).parent).encode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class Code:
    """The code under a checkout as a snapshot would hold it, read but not yet written anywhere."""

    contents: list[tuple[str, bytes, str]]  # (path, bytes, kind): see _contents
    digest: str
    commit: str | None
    dirty: bool | None
    untracked: tuple[str, ...]
    left_out: tuple[LeftOut, ...] = ()

    @property
    def bytes(self) -> int:
        return sum(len(data) for _, data, _ in self.contents)

    def identity(self, root: Path, spec: Path | None) -> str:
        """The digest of its files but `spec` (a spec inside the project is no code of the program: a grid point
        added to it must not make every run "changed")."""
        left = os.path.relpath(spec.resolve(), root.resolve()) if spec is not None else None
        return digest([c for c in self.contents if c[0] != left]) if left in {c[0] for c in self.contents} \
            else self.digest

    def record(self, source: str) -> dict:
        """What SNAPSHOT.json says of it."""
        return {"digest": self.digest, "commit": self.commit, "dirty": self.dirty, "source": source,
                "files": len(self.contents), "bytes": self.bytes, "taken_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def read(root: Path, max_file_bytes: int | None = None, everything: bool = False, include: tuple[str, ...] = ()
         ) -> Code:
    """The code under `root`, named by a hash of its paths, kinds and contents; a file over `max_file_bytes`
    (default MAX_FILE_BYTES) is refused. `everything`: a user's project (source_files), with what it leaves out."""
    files, commit, dirty = source_files(root, everything)
    tracked = frozenset(files) if dirty is not None else frozenset()  # (git's; what `include` adds is not)
    files = _with_included(root, files, include)
    contents = _contents(root, files, MAX_FILE_BYTES if max_file_bytes is None else max_file_bytes, tracked)
    untracked = tuple(f for f in (_git(root, "ls-files", "-z", "--others", "--exclude-standard", "--", "*.py")
                                  or "").split("\0") if f)
    return Code(contents, digest(contents), commit, dirty, untracked,
                left_out(root, set(files)) if everything else ())


def digest(contents: list[tuple[str, bytes, str]]) -> str:
    """The name of a set of files (path, bytes, kind): a hash of their paths, sizes, kinds and contents."""
    h = hashlib.sha256()
    for rel, data, kind in contents:
        h.update(f"{rel}\0{len(data)}\0{kind}\0".encode("utf-8", "surrogateescape") + data)
    return h.hexdigest()[:16]


def received(root: Path) -> Snapshot | None:
    """`root` itself when it is a snapshot already, the code a laptop sent to a login node (remote/laptop.py): its
    record names it, and it is never changed, so the jobs run it where it is."""
    try:
        record = json.loads((root / RECORD).read_text())
        if record["digest"] != root.name:
            return None
        return Snapshot(root, record["digest"], record["commit"], record["dirty"], record["files"], record["bytes"],
                        True, identity=record["digest"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def take(root: Path, dest_dir: Path, max_file_bytes: int | None = None, everything: bool = False,
         include: tuple[str, ...] = (), spec: Path | None = None) -> Snapshot:
    """Snapshot the code under `root` into `dest_dir/<digest>/` (or reuse the one there); a file over
    `max_file_bytes` (default MAX_FILE_BYTES) is refused. Code that a laptop sent is its own snapshot.
    `everything`: a user's project, all its files when it is no git work tree (source_files), and the files
    the `include` globs match beside them."""
    if (already := received(root)) is not None:
        return already
    code = read(root, max_file_bytes, everything, include)
    target = dest_dir / code.digest
    snap = Snapshot(target, code.digest, code.commit, code.dirty, len(code.contents), code.bytes,
                    (target / RECORD).is_file(), code.untracked, code.left_out, code.identity(root, spec))
    if snap.reused:
        return snap
    dest_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest_dir, prefix=durable.temp_prefix(target), suffix=durable.TEMP_SUFFIX))
    durable.write(tmp / RECORD, json.dumps(code.record(str(root)), indent=1) + "\n")
    for rel, data, kind in code.contents:
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "link":
            path.symlink_to(data.decode("utf-8", "surrogateescape"))
        else:
            _place(_stored(dest_dir / OBJECTS, data, kind), path)
    durable.fsync_dir(dest_dir / OBJECTS)
    try:
        os.replace(tmp, target)
    except OSError:  # another launch made the same snapshot first: same digest, same files
        shutil.rmtree(tmp, ignore_errors=True)
    durable.fsync_dir(dest_dir)
    return snap


def _stored(objects: Path, data: bytes, kind: str) -> Path:
    """The file holding `data` in the sweep's store of file contents (written once, read-only): snapshots
    share their unchanged files as hard links to it, so a one-line change copies one file, not the tree."""
    path = objects / (hashlib.sha256(data).hexdigest() + (".x" if kind == "exec" else ""))
    if not path.is_file():  # (each on disk before it takes its name: a crash never leaves one half-written)
        with durable.replacing(path, sync_dir=False) as fh:  # (take() syncs the folder once)
            fh.write(data)
            os.fchmod(fh.fileno(), 0o555 if kind == "exec" else 0o444)
    return path


def _place(stored: Path, path: Path) -> None:
    try:
        os.link(stored, path)
    except OSError:  # a filesystem without hard links: a copy of its own
        shutil.copy2(stored, path)
