"""The run contract for a Python program of yours that the launcher starts (`command:` in a spec): a few calls,
the standard library only. On the cluster it is importable with nothing installed (`from tinygpt import job`);
anywhere else it answers as a run outside the launcher would (its directory: the current one).

    from tinygpt import job

    job.watch_stop()                                 # first: the stop signal is remembered, not fatal
    state = job.load("state.json")                  # your own checkpoint, from the run's directory, or None
    for step in range(state["step"] if state else 0, steps):
        ...                                          # one step of your training
        job.log(step, loss=loss)                     # a line of metrics.jsonl: status, report and search read it
        job.heartbeat()                              # the hang watchdog's sign of life (command.heartbeat_s)
        if job.stop_requested():                     # the time limit is near, or the job is preempted
            job.save("state.json", {"step": step + 1, ...})
            job.requeue()                            # exits 75: requeued, and this loop resumes where it was

A program that does not import this keeps the same contract by hand: its environment names the run's directory
(TINYGPT_RUN_DIR), the signal that asks it to stop (TINYGPT_STOP_SIGNAL; SIGTERM too), the heartbeat file to
touch (TINYGPT_HEARTBEAT) and the exit status that asks for a requeue (75); `metrics.jsonl` in the run's
directory takes one JSON object a line, each with an integer `step`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from tinygpt.base import durable  # (the standard library only, as this module)

REQUEUE_EXIT = 75  # (EX_TEMPFAIL) the status that asks the launcher to requeue the run
_stop = {"asked": None}  # the signal that asked the program to stop, once one has


def run_dir() -> Path:
    """The run's directory: the same in every life of the run (its checkpoints belong here)."""
    path = Path(os.environ.get("TINYGPT_RUN_DIR") or ".")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _asked(signum: int, _frame: Any) -> None:
    _stop["asked"] = signum


def watch_stop() -> None:
    """From now on, the stop signal (and SIGTERM) is remembered instead of ending the program: ask
    `stop_requested()` at each step. Called by the first `stop_requested()`; call it early to catch a signal
    that comes sooner."""
    name = os.environ.get("TINYGPT_STOP_SIGNAL", "SIGUSR2")
    for signum in {getattr(signal, name, signal.SIGUSR2), signal.SIGTERM}:
        signal.signal(signum, _asked)


def stop_requested() -> bool:
    """Whether the run was asked to stop (time limit near, preemption): then save, and `requeue()`."""
    if _stop["asked"] is None and signal.getsignal(signal.SIGTERM) is not _asked:
        watch_stop()
    return _stop["asked"] is not None


def requeue() -> None:
    """End the program with the status that asks for a requeue: the next life finds the run's directory again."""
    sys.stdout.flush()
    sys.exit(REQUEUE_EXIT)


def heartbeat() -> None:
    """Touch the heartbeat file (a run silent for longer than command.heartbeat_s is stopped as hung)."""
    if path := os.environ.get("TINYGPT_HEARTBEAT"):
        Path(path).touch()


def log(step: int, **values: Any) -> None:
    """Append `{"step": step, **values}` to the run's metrics.jsonl (one line, written whole)."""
    durable.append_line(run_dir() / "metrics.jsonl", json.dumps({"step": int(step), **values, "time": time.time()}))


def save(name: str, state: Any) -> None:
    """Write `state` (JSON) to NAME in the run's directory: whole or not at all (a temporary file, renamed)."""
    durable.write(run_dir() / name, json.dumps(state))


def load(name: str) -> Any:
    """What `save(name, ...)` wrote last, or None before the first save."""
    try:
        return json.loads((run_dir() / name).read_text())
    except FileNotFoundError:
        return None
