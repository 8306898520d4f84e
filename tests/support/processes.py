"""Processes the tests start and wait on: the launcher, a trainer module, a world of ranks; events, not clocks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.paths import ROOT


def wait_until(predicate, timeout: float = 120.0, poll: float = 0.1, what="condition", proc=None):
    """`predicate()`'s value once it is true, polled every `poll` s; fails loudly when `timeout` s pass first, or
    when `proc` (a process the condition waits on) has ended first (then with its output, if it was captured).
    `what` names the condition: text, or a function that gives it when it fails (logs as they are by then)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            out = proc.communicate()
            pytest.fail(f"the process ended (exit {proc.returncode}) before {_said(what)}: {out}")
        if time.monotonic() > deadline:
            if proc is not None:
                proc.kill()
            raise TimeoutError(f"{_said(what)} not reached within {timeout:.0f} s")
        time.sleep(poll)


def _said(what) -> str:
    return what() if callable(what) else what


def slow_saves(seconds: float) -> dict[str, str]:
    """Environment under which every checkpoint write stalls `seconds` before its rename (tests/support/slow_saves)."""
    folder = ROOT / "tests" / "support" / "slow_saves"
    path = os.pathsep.join([str(folder), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path, "TINYGPT_TEST_SAVE_STALL_S": str(seconds)}


def python_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TINYGPT_OFFLINE", "1")
    env.update(extra)
    return env


def launch(*args: str, cwd: Path = ROOT, timeout: float = 180, env: dict[str, str] | None = None,
           columns: int = 250) -> subprocess.CompletedProcess:
    """`python launch.py ARGS` as a user runs it, in a COLUMNS-wide terminal: the repository importable, offline,
    `env` on top (it is also what a submitted job inherits: sbatch exports it)."""
    return subprocess.run([sys.executable, str(ROOT / "launch.py"), *args], capture_output=True, text=True, cwd=cwd,
                          env=python_env(COLUMNS=str(columns), **(env or {})), timeout=timeout)


def run_cli(argv: list[str]) -> tuple[int, str]:
    """`launch.py ARGV` in this process: (exit status, what it printed to stderr)."""
    import contextlib
    import io

    from tinygpt.launch.commands import cli

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(argv)
    return code, err.getvalue()


def main_status(main, argv: list[str]) -> tuple[int, str]:
    """A command's main() on argv in this process: (exit status, stderr), argparse's own exits (status 2)
    included."""
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
    return code, err.getvalue()


def run_module(module: str, *args: str, cwd: Path | None = None, timeout: float = 300,
               **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          cwd=cwd or ROOT, timeout=timeout, env=python_env(**env))


def free_port() -> int:
    """A loopback port nothing listens on now (for a master of ranks started here)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ranks(module: str, args: list[str], env: dict[str, str], size: int = 2) -> list:
    """A world of `size` ranks on this machine, each given the variables `torchrun --standalone` gives it."""
    world = {"WORLD_SIZE": str(size), "LOCAL_WORLD_SIZE": str(size), "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(free_port())}
    from tinygpt.launch.submit.fork_server import Forked

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
