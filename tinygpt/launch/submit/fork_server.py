"""`python -m MODULE ARGS` as processes forked from one server that has imported torch once.

Every trainer process pays for `import torch` and for torch._dynamo, which torch.optim imports the first time an
optimizer is made: about 4 s of CPU before its first step on a small machine, where a small run trains for less.
Where one command starts many of them (the runs of `launch.py SPEC --local`, the checks of bench/gpu_check.py,
the tests about processes), each is forked from Python's multiprocessing fork server instead, which imported
those two once: a child costs its own work.

A child is what `python -m MODULE ARGS` would be, in the environment, folder and (unless captured) standard
streams it is given: it imports the project afresh from its own PYTHONPATH (a sweep's code snapshot), and the
`sitecustomize` of the first folder that PYTHONPATH adds, as an interpreter does when it starts; its temporary
files go where its TMPDIR says, and its exit hooks (atexit) run as it ends. What it shares with the server is
torch as imported before the child's environment was set. The server never starts CUDA, so a child may. Linux
only (`available()`): elsewhere, and where a fork is not wanted, start a real interpreter. This module imports
no torch; the server does.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path

PRELOAD = ["torch", "torch._dynamo"]


def available() -> bool:
    """Forking a process that has imported torch is safe on Linux; macOS's system libraries refuse it."""
    return sys.platform.startswith("linux")


def _server() -> multiprocessing.context.BaseContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def _child(module: str, args: list[str], env: dict[str, str], cwd: str, streams: str | None) -> None:
    if streams is not None:  # (first: what fails from here on, a missing folder say, is said in them)
        for fd, name in ((1, "stdout"), (2, "stderr")):
            file = os.open(os.path.join(streams, name), os.O_WRONLY | os.O_TRUNC)
            os.dup2(file, fd)
            os.close(file)
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # (found again from this child's TMPDIR, as a new interpreter would)
    os.chdir(cwd)
    added = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[:0] = added
    # The project as this child's PYTHONPATH has it (this module came from the parent's): imported afresh.
    for name in [m for m in sys.modules if m == "tinygpt" or m.startswith("tinygpt.")]:
        del sys.modules[name]
    first = next((p for p in added if os.path.isfile(os.path.join(p, "sitecustomize.py"))), None)
    if first is not None:
        runpy.run_path(os.path.join(first, "sitecustomize.py"))
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        # What an interpreter runs as it ends (W&B's and tempfile's cleanups, say): multiprocessing ends a child
        # with os._exit, which skips them.
        atexit._run_exitfuncs()


class Forked:
    """A forked `python -m MODULE ARGS`, read as a subprocess.Popen: pid, returncode, poll, wait, send_signal,
    kill; with `capture`, communicate gives its stdout and stderr as text once it has ended, else it writes to
    this process's streams."""

    def __init__(self, module: str, args: list[str], env: dict[str, str], cwd: Path | str | None = None,
                 capture: bool = True):
        self.args = [module, *args]
        self._streams = None
        if capture:
            self._streams = tempfile.mkdtemp(prefix="tinygpt-forked-")
            for name in ("stdout", "stderr"):  # (there to read even if the child never starts)
                Path(self._streams, name).touch(0o600)
            # (gone once communicate has read it, or with this object: a process killed and waited for)
            self._remove_streams = weakref.finalize(self, shutil.rmtree, self._streams, ignore_errors=True)
        self._process = _server().Process(target=_child, daemon=False,
                                          args=(module, [str(a) for a in args], dict(env),
                                                str(cwd or os.getcwd()), self._streams))
        self._process.start()
        self.pid = self._process.pid

    @property
    def returncode(self) -> int | None:
        """As subprocess's: the exit status, -N when signal N ended it, None while it runs."""
        return self._process.exitcode

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        if self._streams is None:
            return "", ""
        streams = Path(self._streams)
        out, err = ((streams / name).read_text(errors="replace") for name in ("stdout", "stderr"))
        self._remove_streams()
        return out, err


def run(module: str, args: list[str], env: dict[str, str], cwd: Path | str | None = None,
        timeout: float | None = None) -> subprocess.CompletedProcess:
    """As subprocess.run(..., capture_output=True, text=True): the ended process, its exit status and output."""
    proc = Forked(module, args, env, cwd)
    try:
        out, err = proc.communicate(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
