"""A command's run under `start: torchrun` (spec/command.py): torchrun's words for this node, and each worker's exit
status, which torchrun keeps to itself, for the node's supervisor (node/supervise.py).

The batch script starts one task per node; its supervisor starts

    PYTHON -m torch.distributed.run --nnodes=N --nproc-per-node=P --rdzv-backend=c10d
        --rdzv-endpoint=FIRST_NODE:PORT --rdzv-id=JOB-RESTART --rdzv-conf=is_host=0|1
        --max-restarts=0 --no-python PYTHON -m tinygpt.launch.node.torchrun_start ENDS PROGRAM ARGS...

(`--standalone` on one node). torchrun gives each worker RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT;
each worker here is this module's `main`, a process of a few megabytes beside the program, as the supervisor is
beside torchrun: it passes every signal on to the program and leaves its own pid in ENDS/LOCAL_RANK.pid and the
program's exit status in ENDS/LOCAL_RANK, since torchrun ends with 1 whenever any worker ends otherwise than 0, and
with 1 again when it is stopped by a signal, whatever its workers did (and it may even abort while it stops them,
before they have saved: the supervisor waits for every worker before it reads their statuses).

Signals: torchrun passes SIGTERM, SIGINT, SIGHUP and SIGQUIT on to its workers, and dies of any other; it is told
to pass the profile's stop signal on too. Like every process of the job step it gets Slurm's signals itself, so
the supervisor passes none on to it. Once signalled, torchrun kills its workers after a shutdown timeout (30 s by
default); it is told to wait as long as they take, Slurm's own kill being the bound (a torch whose torchrun has
no --shutdown-timeout keeps its 30 s).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tinygpt.job import REQUEUE_EXIT  # (the standard library's only: a few megabytes beside each worker)

TORCHRUN_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")  # torchrun's own, passed on to its workers
PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGCONT)
SHUTDOWN_S = 24 * 3600  # how long torchrun lets a stopped worker save: no limit of its own


def words(argv: list[str], procs_per_node: int, ends: Path, environ: dict[str, str], master: tuple[str, int]
          ) -> list[str]:
    """torchrun's words on this node: its rendezvous (the job's first node hosts it), then every worker as this
    module around the program's `argv`."""
    nodes = int(environ.get("SLURM_STEP_NUM_NODES") or environ.get("SLURM_JOB_NUM_NODES") or 1)
    if nodes > 1:
        job = environ.get("SLURM_JOB_ID", "0")
        rendezvous = [f"--nnodes={nodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={master[0]}:{master[1]}",
                      f"--rdzv-id={job}-{environ.get('SLURM_RESTART_COUNT') or 0}",
                      f"--rdzv-conf=is_host={int(environ.get('SLURM_NODEID', '0') == '0')}"]
    else:
        rendezvous = ["--standalone"]
    return [sys.executable, "-m", "torch.distributed.run", *rendezvous, f"--nproc-per-node={procs_per_node}",
            "--max-restarts=0", "--no-python", sys.executable, "-m", __spec__.name, str(ends), *argv]


def environment(env: dict[str, str], stop_signal: str) -> dict[str, str]:
    """torchrun's environment: told to pass the stop signal on, not to die of it, and to let its workers take
    the time they need to save (Slurm's time limit, or its KillWait after a SIGTERM, bounds it)."""
    handled = ",".join(dict.fromkeys((*TORCHRUN_SIGNALS, f"SIG{stop_signal}")))
    # (torchrun 2.13 reads its --signals-to-handle from PET_..., older ones TORCHELASTIC_... only)
    return {**env, "PET_SIGNALS_TO_HANDLE": handled, "TORCHELASTIC_SIGNALS_TO_HANDLE": handled,
            "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(SHUTDOWN_S)}


def node_status(ends: Path, procs_per_node: int, torchrun_code: int) -> int:
    """The node's exit status from its workers', once every worker that started has ended (torchrun may end
    before them: it aborts now and then while it stops them): 0 when all ended 0; 75 (requeue) when all ended 0
    or 75; else the first other status (a crash, whatever the others did after it), or torchrun's when a worker
    left none (it was killed, or never started)."""
    for pid_file in ends.glob("*.pid"):
        _wait_for(pid_file)
    codes = []
    for rank in range(procs_per_node):
        try:
            codes.append(int((ends / str(rank)).read_text()))
        except (OSError, ValueError):
            codes.append(None)
    failed = [c for c in codes if c not in (0, REQUEUE_EXIT, None)]
    if failed:
        return failed[0]
    if None in codes:
        return torchrun_code or 1
    return REQUEUE_EXIT if REQUEUE_EXIT in codes else 0


def _wait_for(pid_file: Path) -> None:
    """Until the worker whose pid the file holds has ended (not ours to wait on: torchrun's child)."""
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return
    while _running(pid):
        time.sleep(0.2)


def _running(pid: int) -> bool:
    """Whether `pid` is a process that has not ended: one that has, unreaped (a zombie: where no process reaps
    orphans, it stays one), has ended."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def main(argv: list[str]) -> int:
    """One worker: the program started with torchrun's environment, every signal passed on, its status left."""
    if len(argv) < 2:
        print("usage: python -m tinygpt.launch.node.torchrun_start ENDS PROGRAM [ARG...]", file=sys.stderr)
        return 2
    ends, program = Path(argv[0]), argv[1:]
    rank = os.environ.get("LOCAL_RANK", "0")
    (ends / f"{rank}.pid").write_text(str(os.getpid()))
    try:
        child = subprocess.Popen(program)
    except OSError as err:
        print(f"tinygpt: cannot start {program[0]} ({err.strerror}); check command.argv", file=sys.stderr)
        code = 127
    else:
        for signum in PASSED_ON:
            signal.signal(signum, lambda s, _: child.send_signal(s))
        code = child.wait()
        code = 128 - code if code < 0 else code
    (ends / rank).write_text(str(code))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
