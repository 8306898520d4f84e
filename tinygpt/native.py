"""Building and loading tinygpt's C++ extensions (tinygpt/csrc): the CPU kernels (tinygpt/cpu_kernels.py)
and the caching CPU allocator (tinygpt/cpu_allocator.py).

Each is built on first use with the machine's C++ compiler (torch.utils.cpp_extension, ninja) and cached
under $TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions) in a directory named after the CPU model and
flags and the torch version, so a home directory shared by different nodes keeps one correct build per CPU.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import time
from pathlib import Path

import torch

CSRC = Path(__file__).resolve().parent / "csrc"
STALE_LOCK_S = 600  # a build takes about a minute; a lock file this old was left by a build that died


def _cpu_signature() -> str:
    """What -march=native compiles for: the CPU's model and flags, plus the torch it links against."""
    text = ""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        pass
    lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features", "CPU part"))]
    seen = "\n".join(dict.fromkeys(lines))  # the same for every core
    return hashlib.sha1(f"{platform.machine()}\n{torch.__version__}\n{seen}".encode()).hexdigest()[:12]


@contextlib.contextmanager
def _project_ninja_first():
    """torch builds with the first ninja on PATH. Put the pip package's (a dependency of this project) first
    while it builds, so that every process uses the same one whatever its PATH: a build directory used by
    two ninja versions is compiled again from scratch at each change (measured: pip's 1.13 found the log of
    the system's 1.11 "too old" and recompiled everything, a minute; a process without a compiler on PATH
    then failed to load kernels that were built)."""
    try:
        import ninja  # the pip package
    except ImportError:
        yield  # whichever ninja PATH has
        return
    old = os.environ.get("PATH")
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + (old or "")
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = old


def build_directory(stem: str) -> Path:
    from torch.utils.cpp_extension import get_default_build_root

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    return Path(root) / f"{stem}_{_cpu_signature()}"


def _clear_stale_lock(directory: Path, say) -> None:
    """torch holds a `lock` file in the build directory while it builds and waits, without end, for
    whoever holds it. A build killed midway (a job at its time limit) leaves it behind; remove it once
    it is far older than a build takes, or every later run would wait forever."""
    lock = directory / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if age > STALE_LOCK_S:
        say(f"note: removing {lock}, left {age / 60:.0f} min ago by a build that did not finish")
        lock.unlink(missing_ok=True)


def load(stem: str, sources: tuple[str, ...], what: str, say, cflags: list[str], ldflags: list[str] = (),
         takes: str = "about a minute"):
    """The extension built from `sources` (names in tinygpt/csrc), building it first if need be; `say`
    gets a line before a fresh build and after any build. Raises whatever the build raised."""
    from torch.utils.cpp_extension import load as torch_load

    directory = build_directory(stem)
    fresh = not any(directory.glob("*.so"))
    if fresh:
        say(f"building {what} for this CPU (once; {takes}) in {directory}")
    started = time.perf_counter()
    directory.mkdir(parents=True, exist_ok=True)
    _clear_stale_lock(directory, say)
    # torch warns at length about any compiler that is not g++ (clang++ works as well); callers report a
    # failed build in one line.
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with _project_ninja_first():
            module = torch_load(name=directory.name, sources=[str(CSRC / name) for name in sources],
                                extra_cflags=cflags, extra_ldflags=list(ldflags), extra_include_paths=[str(CSRC)],
                                build_directory=str(directory), verbose=False)
    finally:
        logger.setLevel(level)
    took = time.perf_counter() - started
    if fresh or took > 5:  # also a rebuild: torch rebuilds when a source or the compiler flags changed
        say(f"built {what} in {took:.0f} s")
    return module


def why(err: Exception) -> str:
    """The compiler's own words from a failed build, without ninja's progress and command lines."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    kept = [ln for ln in lines if not ln.startswith(("[", "FAILED:", "Error building extension")) and " -o " not in ln]
    return "; ".join(kept[:4] or lines[-1:])[:300].rstrip(".")
