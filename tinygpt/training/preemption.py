"""Leaving gracefully when Slurm says the time is up, and coming back.

The handlers only record the request: a signal can arrive in the middle of a CUDA call, a collective or
a checkpoint write, and doing I/O or collectives inside a handler is how jobs hang. The training loop
looks at the flag at every step boundary, all ranks agree with one collective (`any_rank`), rank 0 saves
a checkpoint, and then:

- on the *preemption signal* (default USR2; what `#SBATCH --signal=USR2@120` sends before the time
  limit, or `scancel -s USR2`), rank 0 requeues the job with `scontrol requeue`, and the next start
  resumes from the checkpoint. When scontrol is missing (containers) or fails, the process exits with
  REQUEUE_EXIT, which the batch scripts turn into a resubmission.
- on SIGTERM (scancel, or preemption with PreemptMode=REQUEUE, where Slurm requeues the job itself),
  it saves and leaves without requeueing: a user's scancel means stop.

Why USR2 by default: submitit uses it too, so every backend signals alike, and USR1 is taken by some
communication libraries and debuggers for their own purposes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field

from tinygpt.job import REQUEUE_EXIT

# Set to "script" by a batch script that runs several trainers in one task (`pack`): they requeue together,
# so each trainer leaves the requeue to the script.
REQUEUE_ENV = "TINYGPT_REQUEUE"

# Signals recorded before the handler proper was installed (see install_early_recorder).
EARLY_SIGNALS: list[str] = []
_EARLY_NAMES = ("USR1", "USR2", "XCPU", "TERM")


def _record_early(signum: int, frame) -> None:  # noqa: ARG001 (signal API)
    EARLY_SIGNALS.append(signal.Signals(signum).name.removeprefix("SIG"))


def install_early_recorder() -> None:
    """At process start (before heavy imports): record the signals Slurm may send instead of dying.

    After training, when the handler proper is gone, they stay: a late warning is recorded and ignored.
    """
    for name in _EARLY_NAMES:
        signal.signal(getattr(signal, f"SIG{name}"), _record_early)


def ignore_from_now_on() -> None:
    """At the very end of the process (training over, or stopped and saved): ignore the signals Slurm may
    still send. Python puts its own handlers back to the default action, death, as it shuts down, before it
    tears the modules down, and a time-limit warning landing then would turn a finished job into a FAILED
    one."""
    for name in _EARLY_NAMES:
        signal.signal(getattr(signal, f"SIG{name}"), signal.SIG_IGN)


@dataclass
class StopRequest:
    signal_name: str
    reason: str


@dataclass
class PreemptionHandler:
    signal_name: str = "USR2"
    request: StopRequest | None = None
    _previous: dict = field(default_factory=dict)

    def install(self) -> PreemptionHandler:
        wanted = {self.signal_name, "TERM"}
        for name in sorted(wanted):
            signum = getattr(signal, f"SIG{name}")
            self._previous[signum] = signal.signal(signum, self._handle)
        for name in EARLY_SIGNALS:  # arrived while the process was starting
            if name in wanted:
                self._handle(getattr(signal, f"SIG{name}"), None)
        EARLY_SIGNALS.clear()
        return self

    def uninstall(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:  # noqa: ARG002 (signal API)
        name = signal.Signals(signum).name.removeprefix("SIG")
        if self.request is not None and self.request.signal_name == self.signal_name:
            return  # a requeue was asked for already; a later TERM does not undo it
        if name == "TERM":
            self.request = StopRequest(name, "terminated (scancel or preemption)")
        else:
            self.request = StopRequest(name, f"SIG{name} (time limit approaching, or sent by hand)")

    @property
    def requested(self) -> bool:
        return self.request is not None

    @property
    def wants_requeue(self) -> bool:
        return self.request is not None and self.request.signal_name != "TERM"


def slurm_job_id(environ: dict[str, str] | None = None) -> str | None:
    """The id `scontrol requeue` needs: `<array job>_<task>` for an array task, else the job id."""
    env = os.environ if environ is None else environ
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID")


def restart_count(environ: dict[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    try:
        return int(env.get("SLURM_RESTART_COUNT", "0") or 0)
    except ValueError:
        return 0


def requeue(job_id: str, timeout_s: float = 30.0) -> tuple[bool, str]:
    """Ask Slurm to requeue `job_id`; (ok, message)."""
    if shutil.which("scontrol") is None:
        return False, "scontrol is not on PATH"
    # Slurm signals every process of the job's steps, and on more than one node it may reach this one after the
    # others have stopped and told this rank so: a requeue call that the late signal killed would leave the job
    # FAILED. The call runs with those signals blocked (a child inherits the mask); this process takes them
    # once the call has returned.
    signals = {getattr(signal, f"SIG{name}") for name in _EARLY_NAMES}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        out = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False, f"scontrol requeue {job_id} timed out after {timeout_s:.0f} s"
    except OSError as err:
        return False, f"scontrol could not run: {err}"
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    if out.returncode != 0:
        return False, (out.stderr or out.stdout).strip() or f"scontrol exited with {out.returncode}"
    return True, f"requeued job {job_id}"


def leave(request: StopRequest | None, restarts: int, max_requeues: int, record: Callable[[str | None], None],
          requeue_hook: Callable[[], None] | None = None, environ: dict[str, str] | None = None) -> int:
    """What a run that stopped for a signal, saved, does next; returns the process's exit status.

    request: the signal this rank received (None: another rank's). `record(what)` is called once with what
    was done about a requeue (None: nothing to do, the signal asked to stop), before `requeue_hook`, which
    may not return (submitit requeues and exits there)."""
    env = os.environ if environ is None else environ
    if request is not None and request.signal_name == "TERM":
        record(None)
        return 0
    job = slurm_job_id(env)
    if restarts >= max_requeues:
        record(f"not requeued: {restarts} restarts reached max_requeues")
    elif requeue_hook is not None:
        record("handed over to the launcher's requeue mechanism")
        requeue_hook()
    elif env.get(REQUEUE_ENV) == "script":
        record("left to the batch script (runs packed in one task requeue together)")
        return REQUEUE_EXIT
    elif job is None:
        record("not in a Slurm job; resume by running the same command again")
    else:
        ok, message = requeue(job)
        record(message)
        return 0 if ok else REQUEUE_EXIT
    return 0
