"""`python -m tinygpt.launch.node.supervise MANIFEST INDEX`: one task of a command's run (spec/command.py): the
user's program started in the project's snapshot with the run's words, and kept to the run contract.

The program is told, in its environment:

    TINYGPT_RUN_DIR       the run's directory (made; the same in every life of the run: resume from it)
    TINYGPT_RUN_NAME      the run's name            TINYGPT_SWEEP   the sweep's name
    TINYGPT_STOP_SIGNAL   the signal that asks it to stop (the profile's, before the time limit; SIGTERM at a
                          preemption): save, then exit with status 75 (TINYGPT_REQUEUE_EXIT) to be requeued
    TINYGPT_HEARTBEAT     a file to touch now and then, when command.heartbeat_s is set
    RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT   for a run of several tasks (one per GPU)

This process stays beside the program, a few megabytes and no CPU to speak of: it passes every signal it gets on to
the program; when the program exits 75 it ends the task with 75 too, which the batch script turns into a requeue (at
most command.max_requeues times: after that the run FAILED, and says why), except after a SIGTERM (a scancel, or a
preemption under which Slurm requeues the job itself: it ends with 0, as the trainer does); any other status ends
the task with that status, never requeued. With a heartbeat, a program whose file has not changed for heartbeat_s is
hung: this process records it in the run's metrics.jsonl (`status` shows HUNG), stops the program (SIGTERM, then
SIGKILL) and ends the task with the watchdog's status. The launcher's code is on the program's PYTHONPATH, after the
program's own, for the helper (`from tinygpt import job`): a Python program that uses it needs nothing installed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tinygpt.base import durable
from tinygpt.launch.errors import LaunchError
from tinygpt.launch.manifest import load_run
from tinygpt.training import distributed, metrics
from tinygpt.training.preemption import EXIT_REQUEUE
from tinygpt.training.watchdog import EXIT_HUNG

USAGE = "usage: python -m tinygpt.launch.node.supervise MANIFEST INDEX"
PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT)
STOP_GRACE_S = 10  # a hung program gets this long between SIGTERM and SIGKILL
HEARTBEAT = "heartbeat"  # in the run directory


def environment(head, run, run_dir: Path) -> dict[str, str]:
    """The program's environment: the job's, the contract's variables, the helper on PYTHONPATH."""
    env = dict(os.environ)
    ours = str(Path(__file__).resolve().parents[3])  # (the code snapshot's root: `tinygpt` is in it)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), ours) if p)
    env.update(TINYGPT_RUN_DIR=str(run_dir), TINYGPT_RUN_NAME=run.name, TINYGPT_SWEEP=head.name,
               TINYGPT_STOP_SIGNAL=f"SIG{head.command.stop_signal}", TINYGPT_REQUEUE_EXIT=str(EXIT_REQUEUE))
    if head.command.heartbeat_s:
        env["TINYGPT_HEARTBEAT"] = str(run_dir / HEARTBEAT)
    world = distributed.detect(os.environ)
    if world.world_size > 1:
        env.update(RANK=str(world.rank), WORLD_SIZE=str(world.world_size), LOCAL_RANK=str(world.local_rank),
                   MASTER_ADDR=world.master_addr, MASTER_PORT=str(world.master_port))
    return env


def supervise(manifest: Path, index: int) -> int:
    head, run = load_run(manifest, index)
    if head.command is None:
        raise LaunchError(f"{manifest}: sweep {head.name} runs the trainer, not a command")
    run_dir = Path(run.out_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = head.command.words({**head.base, **run.own, "run_dir": str(run_dir), "run_name": run.name,
                               "sweep": head.name})
    env = environment(head, run, run_dir)
    try:
        program = subprocess.Popen(argv, cwd=head.command.project, env=env)
    except OSError as err:
        print(f"tinygpt: cannot start {argv[0]} in {head.command.project} ({err.strerror}); check command.argv",
              file=sys.stderr)
        return 127
    received = []
    for signum in PASSED_ON:
        signal.signal(signum, lambda s, _: (received.append(s), program.send_signal(s)))
    code = _wait(program, head.command.heartbeat_s, run_dir)
    if code == EXIT_REQUEUE and signal.SIGTERM in received:
        # (scancel, or a preemption under PreemptMode=REQUEUE, where Slurm requeues the job itself: as the trainer)
        print(f"tinygpt: run {run.name} saved on SIGTERM; Slurm requeues a preempted job itself, and a scancel "
              f"means stop", file=sys.stderr)
        return 0
    if code == EXIT_REQUEUE:
        restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        if restarts >= head.command.max_requeues:
            print(f"tinygpt: run {run.name} asked to be requeued after {restarts} requeue(s), the most "
                  f"command.max_requeues allows; not requeued (raise it, or resubmit)", file=sys.stderr)
            return 1
        print(f"tinygpt: run {run.name} saved and asks to be requeued ({restarts} so far)", file=sys.stderr)
    return code


def _wait(program: subprocess.Popen, heartbeat_s: int | None, run_dir: Path) -> int:
    """The program's exit status (128 + N for a signal N); with a heartbeat, EXIT_HUNG once it has gone silent.
    Without one it blocks (a signal's handler still runs); with one it looks once a second."""
    started = time.time()
    code = program.wait() if not heartbeat_s else None
    while code is None:
        time.sleep(1.0)
        code = program.poll()
        if code is None and (silent := time.time() - _last_beat(run_dir, started)) > heartbeat_s:
            _hung(program, run_dir, silent)
            return EXIT_HUNG
    return 128 - code if code < 0 else code


def _last_beat(run_dir: Path, started: float) -> float:
    try:
        return max(started, (run_dir / HEARTBEAT).stat().st_mtime)
    except OSError:
        return started


def _hung(program: subprocess.Popen, run_dir: Path, silent: float) -> None:
    step = max((r["step"] for r in metrics.read(metrics.of_run(run_dir)) if isinstance(r.get("step"), int)),
               default=0)
    print(f"tinygpt: the program's heartbeat is {silent:.0f} s old: hung; stopping it", file=sys.stderr)
    durable.append_line(metrics.of_run(run_dir), json.dumps({"event": "hung", "step": step, "heartbeat_age_s":
                                                             round(silent, 1), "time": time.time()}))
    program.terminate()
    try:
        program.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        program.kill()
        program.wait()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        return supervise(Path(argv[0]), int(argv[1]))
    except (LaunchError, IndexError, ValueError, OSError) as err:
        print(f"tinygpt: cannot start run {argv[1]} of {argv[0]}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
