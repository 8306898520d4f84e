"""`python -m MODULE ARGS` as a process of its own, forked from a server that has imported torch once, for the
tests whose subject is a process (a kill, a signal, a rank, an exit status): each child costs its own work,
not another interpreter start, `import torch` (~2 s of CPU on these machines) and torch._dynamo (~1.2 s), which
every trainer pays before its first step. Python's multiprocessing forkserver is the server.

The child runs the module as `python -m` does (runpy, as __main__, with sys.argv), in the environment, folder
and standard streams it is given, and imports the `sitecustomize` of a folder that its PYTHONPATH puts first
(tests/slow_saves), as an interpreter does when it starts. What it shares with the server is what was imported
before the environment was set: nothing of tinygpt reads the environment when it is imported, and the trainer
sets its own thread count. A test of the interpreter's own start (`python -m tinygpt.train --help`, the
installed command) starts a real one.
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

_SERVER = multiprocessing.get_context("forkserver")
# What every trainer imports; torch._dynamo is what torch.optim imports the first time an optimizer is made.
# (The server imports them from its own sys.path, the interpreter's default: the installed package.)
_SERVER.set_forkserver_preload(["torch", "torch._dynamo", "tinygpt.train", "tinygpt.trainer", "tinygpt.sample"])


def _child(module: str, args: list[str], env: dict[str, str], cwd: str, streams: str) -> None:
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        file = os.open(os.path.join(streams, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(file, fd)
        os.close(file)
    for folder in reversed([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]):
        if folder not in sys.path:
            sys.path.insert(0, folder)
            if os.path.isfile(os.path.join(folder, "sitecustomize.py")):
                runpy.run_path(os.path.join(folder, "sitecustomize.py"))
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


class Forked:
    """A forked `python -m MODULE ARGS`, read as a subprocess.Popen: pid, poll, wait, send_signal, kill, and
    communicate, which gives its stdout and stderr as text once it has ended."""

    def __init__(self, module: str, args: list[str], env: dict[str, str], cwd: Path | str | None = None):
        self.args = [module, *args]
        self._streams = tempfile.mkdtemp(prefix="tinygpt-forked-")
        self._process = _SERVER.Process(target=_child, daemon=False,
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
        streams = Path(self._streams)
        out, err = ((streams / name).read_text(errors="replace") for name in ("stdout", "stderr"))
        shutil.rmtree(streams, ignore_errors=True)
        return out, err


def run(module: str, args: list[str], env: dict[str, str], cwd: Path | str | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess:
    """As subprocess.run(..., capture_output=True, text=True): the ended process, its exit status and output."""
    proc = Forked(module, args, env, cwd)
    try:
        out, err = proc.communicate(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def ranks(module: str, args: list[str], env: dict[str, str], size: int = 2) -> list[Forked]:
    """A world of `size` ranks on this machine, each given the variables `torchrun --standalone` gives it."""
    import socket

    with socket.socket() as s:  # a free port for the master
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = {"WORLD_SIZE": str(size), "LOCAL_WORLD_SIZE": str(size), "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(port)}
    return [Forked(module, args, {**env, **world, "RANK": str(rank), "LOCAL_RANK": str(rank)})
            for rank in range(size)]


def run_world(module: str, args: list[str], env: dict[str, str], size: int = 2,
              timeout: float = 300) -> subprocess.CompletedProcess:
    """A world of `size` ranks to its end, as torchrun's run reads: the highest exit status, every rank's output
    (rank 0's first)."""
    world = ranks(module, args, env, size)
    outputs = [rank.communicate(timeout) for rank in world]
    return subprocess.CompletedProcess([f"rank {r}" for r in range(size)], max(abs(r.returncode) for r in world),
                                       "".join(o for o, _ in outputs), "".join(e for _, e in outputs))
