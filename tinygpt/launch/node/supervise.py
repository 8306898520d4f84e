"""`python -m tinygpt.launch.node.supervise MANIFEST INDEX`: one task of a command's run (spec/command.py): the
user's program started in the project's snapshot with the run's words, and kept to the run contract.

The program is told, in its environment:

    TINYGPT_RUN_DIR       the run's directory (made; the same in every life of the run: resume from it)
                          (point.json there: the run's values as the spec gives them)
    TINYGPT_RUN_NAME      the run's name            TINYGPT_SWEEP   the sweep's name
    TINYGPT_STOP_SIGNAL   the signal that asks it to stop (the profile's, before the time limit; SIGTERM at a
                          preemption): save, then exit with status 75 (TINYGPT_REQUEUE_EXIT) to be requeued
    TINYGPT_HEARTBEAT     a file to touch now and then, when command.heartbeat_s is set
    RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT   for a run of several tasks (one per GPU); under
                          `start: torchrun`, torchrun tells its workers these (node/torchrun_start.py)

This process stays beside the program, a few megabytes and no CPU to speak of: outside a Slurm step it passes every
signal it gets on to the program (in a step the program, and torchrun, get the step's signals themselves, once;
those that came before the program started are passed on); when the program exits 75 it ends the task with
75 too, which the batch script turns into a requeue (at most command.max_requeues times: after that the run FAILED,
and says why), except after a SIGTERM (a scancel, or a preemption under which Slurm requeues the job itself: it ends
with 0, as the trainer does); any other status ends the task with that status, never requeued. A program that ends 0
on its own finished: the run's metrics.jsonl says so (`{"event": "finished"}`), for `status` and a relaunch once
Slurm has forgotten the job. With a heartbeat, a program whose file has not changed for heartbeat_s is hung: this
process records it in the run's metrics.jsonl (`status` shows HUNG), stops the program (SIGTERM, then SIGKILL) and
ends the task with the watchdog's status. A run that finished in an earlier life (a packed task sent again for a run
beside it) is not started again. The launcher's code is on the program's PYTHONPATH, after the program's
own, for the helper (`from tinygpt import job`): a Python program that uses it needs nothing installed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from tinygpt.base import durable
from tinygpt.job import REQUEUE_EXIT
from tinygpt.launch.errors import LaunchError
from tinygpt.launch.manifest import load_run
from tinygpt.launch.node import printed_progress, torchrun_start
from tinygpt.training import distributed, metrics
from tinygpt.training.watchdog import EXIT_HUNG

USAGE = "usage: python -m tinygpt.launch.node.supervise MANIFEST INDEX"
# What the task says of a program that died of the stop signal Slurm sends before the time limit, without asking
# to be requeued: it could not save; a retry policy reads it as a time limit. Said by this process alone, at the
# start of its line (heal/ends.py reads no other line as evidence), and only for the profile's stop signal: a
# SIGTERM is a scancel, a preemption, or srun ending the task because another task of the step failed.
UNSAVED = "died of the signal Slurm sends before the time limit, without saving"
STOPPED = ("died of a signal passed on to it that is not the warning before the time limit (SIGTERM: a scancel, a "
           "preemption, or srun ending the step after another task failed)")
FAILED = "ended with an error of its own, status"  # a status the program chose: its own failure, never retried
PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT)
STOP_GRACE_S = 10  # a hung program gets this long between SIGTERM and SIGKILL
HEARTBEAT = "heartbeat"  # in the run directory
POINT = "point.json"  # in the run directory: its values as the spec gives them (its name is safe, not exact)
REQUEUE_MARK_ENV = "TINYGPT_REQUEUE_MARK"  # the file by which a run of several tasks asks for its requeue


def environment(head, run_name: str, run_dir: Path) -> dict[str, str]:
    """The program's environment: the job's, the contract's variables, the helper on PYTHONPATH."""
    env = dict(os.environ)
    ours = str(Path(__file__).resolve().parents[3])  # (the code snapshot's root: `tinygpt` is in it)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), ours) if p)
    env.update(TINYGPT_RUN_DIR=str(run_dir), TINYGPT_RUN_NAME=run_name, TINYGPT_SWEEP=head.name,
               TINYGPT_STOP_SIGNAL=f"SIG{head.command.stop_signal}", TINYGPT_REQUEUE_EXIT=str(REQUEUE_EXIT))
    if head.command.heartbeat_s:
        env["TINYGPT_HEARTBEAT"] = str(run_dir / HEARTBEAT)
    world = distributed.detect(os.environ)
    if world.world_size > 1 and head.command.start == "tasks":  # (torchrun tells its workers itself)
        env.update(RANK=str(world.rank), WORLD_SIZE=str(world.world_size), LOCAL_RANK=str(world.local_rank),
                   MASTER_ADDR=world.master_addr, MASTER_PORT=str(world.master_port))
    return env


class Ended(NamedTuple):
    code: int | None  # the program's exit status (128 + N for a signal N); None: `watch` stopped it
    signals: list[int]  # the signals passed on to it


def run_program(head, run_name: str, values: dict, run_dir: Path, watch=None) -> Ended:
    """The run's program started with its values in its words and the contract's environment, every signal passed
    on, until it ends: EXIT_HUNG when its heartbeat stops; stopped when `watch()`, asked once a second, says
    so. An OSError when it cannot be started. Under torchrun, torchrun is the program, and the status is the
    node's workers' (node/torchrun_start.py)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    durable.write(run_dir / POINT, json.dumps({"sweep": head.name, "run": run_name, "values": values}, indent=1) + "\n")
    values = {**values, "run_dir": str(run_dir), "run_name": run_name, "sweep": head.name}
    argv = _words(head, run_name, values)
    env = environment(head, run_name, run_dir)
    reads = bool(head.command.progress) and os.environ.get("SLURM_PROCID", "0") == "0"  # (one task records)
    if reads:
        env["PYTHONUNBUFFERED"] = "1"
    under_torchrun = head.command.start == "torchrun"
    procs = int(head.resources.get("tasks_per_node") or 1)
    with tempfile.TemporaryDirectory(prefix="tinygpt-workers-") as ends:
        if under_torchrun:
            argv = torchrun_start.words(argv, procs, Path(ends), dict(os.environ), _master())
            env = torchrun_start.environment(env, head.command.stop_signal)
        received: list[int] = []
        started: list[subprocess.Popen] = []
        passes_on = not under_torchrun and not _in_slurm_step()

        def passed_on(signum, _):
            received.append(signum)
            if started and passes_on:
                started[0].send_signal(signum)
        # (handled before the program starts: a signal at its start, such as a time limit's warning sent as the
        # job starts, would otherwise end this process and leave the program without its supervisor)
        before = {signum: signal.signal(signum, passed_on) for signum in PASSED_ON}
        try:
            program = subprocess.Popen(argv, cwd=head.command.project, env=env,
                                       **({"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT} if reads else {}))
            reader = printed_progress.Reader(program.stdout, head.command.progress, run_dir) if reads else None
            started.append(program)
            for signum in received if not under_torchrun else []:  # (those that came before it was there to get them)
                program.send_signal(signum)
            code = _wait(program, head.command.heartbeat_s, run_dir, watch)
            for said in reader.finish() if reader else []:
                print(said, file=sys.stderr)
        finally:
            for signum, handler in before.items():
                # A search worker's own handlers come back, for its next trial. A default one does not: a signal
                # after the program's end (Slurm's warning again) would kill this process before it says how the
                # program ended, and the step would end of that signal, not requeued. (A handler, not SIG_IGN,
                # which a process this one starts would inherit.)
                signal.signal(signum, _too_late if handler == signal.SIG_DFL else handler)
        if under_torchrun and code not in (None, EXIT_HUNG):
            code = torchrun_start.node_status(Path(ends), procs, code)
        return Ended(code, received)


def _too_late(signum, _) -> None:
    """A signal that came after the program ended: nothing to pass it on to."""


def _words(head, run_name: str, values: dict) -> list[str]:
    """The words this life starts with: a first life's, or, once resume.when finds a save, a resumed one's."""
    found = head.command.resume_file(values)
    argv = head.command.words(values, None if found is None else str(found))
    if found is not None:
        print(f"tinygpt: run {run_name} resumes, as {found} exists: {' '.join(argv[len(head.command.argv):])}",
              file=sys.stderr)
    return argv


def _in_slurm_step() -> bool:
    """Whether this process runs in a Slurm step, where the program gets the step's signals itself, as every process
    of the step does (slurmstepd signals the step's process group, cgroup or process tree, whichever its proctrack
    plugin keeps): passed on too, it would get each twice (Lightning saved twice and asked for two requeues).
    Outside one (--local, a search worker's program) only this process is signalled, and it passes each on."""
    return "SLURM_STEP_ID" in os.environ


def _master() -> tuple[str, int]:
    world = distributed.detect(os.environ)
    return world.master_addr, world.master_port


def _wait(program: subprocess.Popen, heartbeat_s: int | None, run_dir: Path, watch) -> int | None:
    started = time.time()
    code = program.wait() if not (heartbeat_s or watch) else None
    while code is None:
        time.sleep(1.0)
        if (code := program.poll()) is not None:
            break
        if heartbeat_s and (silent := time.time() - _last_beat(run_dir, started)) > heartbeat_s:
            _hung(program, run_dir, silent)
            return EXIT_HUNG
        if watch is not None and watch():
            _stop(program)
            return None
    return 128 - code if code < 0 else code


def supervise(manifest: Path, index: int) -> int:
    head, run = load_run(manifest, index)
    if head.command is None:
        raise LaunchError(f"{manifest}: sweep {head.name} runs the trainer, not a command")
    if _finished(Path(run.out_dir)):  # (a packed task sent again for a run beside it that failed)
        print(f"tinygpt: run {run.name} finished in an earlier life (its metrics.jsonl says so); not started "
              f"again", file=sys.stderr)
        return 0
    try:
        ended = run_program(head, run.name, {**head.base, **run.own}, Path(run.out_dir))
    except OSError as err:
        print(f"tinygpt: cannot start {head.command.argv[0]} in {head.command.project} ({err.strerror}); check "
              f"command.argv", file=sys.stderr)
        return 127
    if ended.code == 0 and signal.SIGTERM not in ended.signals and os.environ.get("SLURM_PROCID", "0") == "0":
        # (the run's own record that it finished: what a relaunch reads once Slurm has forgotten the job)
        durable.append_line(metrics.of_run(Path(run.out_dir)), json.dumps({"event": "finished", "step": _last_step(
            Path(run.out_dir)), "time": time.time()}))
    return after(ended, head, run.name)


def after(ended: Ended, head, run_name: str) -> int:
    """The task's exit status once the program has ended (see the module's docstring)."""
    if ended.code == REQUEUE_EXIT and signal.SIGTERM in ended.signals:
        # (scancel, or a preemption under PreemptMode=REQUEUE, where Slurm requeues the job itself: as the trainer)
        print(f"tinygpt: run {run_name} saved on SIGTERM; Slurm requeues a preempted job itself, and a scancel "
              f"means stop", file=sys.stderr)
        return 0
    if ended.code == REQUEUE_EXIT:
        restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        if restarts >= head.command.max_requeues:
            print(f"tinygpt: run {run_name} asked to be requeued after {restarts} requeue(s), the most "
                  f"command.max_requeues allows; not requeued (raise it, or resubmit)", file=sys.stderr)
            return 1
        print(f"tinygpt: run {run_name} saved and asks to be requeued ({restarts} so far)", file=sys.stderr)
        return _requeue()
    if ended.code is not None and ended.code - 128 in ended.signals:
        name = signal.Signals(ended.code - 128).name
        print(f"tinygpt: run {run_name} {UNSAVED if name == f'SIG{head.command.stop_signal}' else STOPPED} ({name})",
              file=sys.stderr)
    elif ended.code not in (0, None) and ended.code < 128 and ended.code != EXIT_HUNG:
        print(f"tinygpt: run {run_name} {FAILED} {ended.code}", file=sys.stderr)
    return ended.code


def _requeue() -> int:
    """75, or, in a step of several tasks, 0 with the batch script's requeue file made (by task 0): srun stops a
    step's other tasks when one ends otherwise than 0 (--kill-on-bad-exit, for a crash), which would cut short
    the others' saving."""
    mark = os.environ.get(REQUEUE_MARK_ENV)
    if not mark or int(os.environ.get("SLURM_NTASKS") or 1) == 1:
        return REQUEUE_EXIT
    if os.environ.get("SLURM_PROCID", "0") == "0":
        Path(mark).touch()
    return 0


def _last_beat(run_dir: Path, started: float) -> float:
    try:
        return max(started, (run_dir / HEARTBEAT).stat().st_mtime)
    except OSError:
        return started


def _finished(run_dir: Path) -> bool:
    """Whether the run's latest event is this process's record that its program finished."""
    events = [r["event"] for r in metrics.read(metrics.of_run(run_dir)) if r.get("event")]
    return bool(events) and events[-1] == "finished"


def _last_step(run_dir: Path) -> int:
    return max((r["step"] for r in metrics.read(metrics.of_run(run_dir)) if isinstance(r.get("step"), int)),
               default=0)


def _hung(program: subprocess.Popen, run_dir: Path, silent: float) -> None:
    step = _last_step(run_dir)
    print(f"tinygpt: the program's heartbeat is {silent:.0f} s old: hung; stopping it", file=sys.stderr)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()  # (where it hung: a retry goes elsewhere)
    durable.append_line(metrics.of_run(run_dir), json.dumps({"event": "hung", "step": step, "heartbeat_age_s":
                                                             round(silent, 1), "silent_nodes": [node],
                                                             "time": time.time()}))
    _stop(program)


def _stop(program: subprocess.Popen) -> None:
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
