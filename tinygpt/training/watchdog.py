"""A thread that ends a run whose ranks have stopped making progress, and says where they stood.

A rank stopped by a dead GPU, a stuck collective or a frozen filesystem raises no error: the others wait
for it in their next all-reduce until the job's time limit, and the log says nothing. Each rank's watchdog
expects a beat (a training step, an evaluation or a checkpoint completed) at least every `hang_timeout`
seconds. When none comes, the rank says so in the rendezvous store and waits a few seconds for the other
ranks to say it too: those that never do are the ones that stopped (a stopped process runs nothing, not
even this thread). It then writes the Python stacks of all its threads into its log, the lowest rank still
alive appends a `hung` record to metrics.jsonl (step, its node, the ranks that did not answer and their
nodes), a silent rank on its own node is killed (a stopped process takes no other signal; its state is in
the newest checkpoint), and the process ends with EXIT_HUNG, so the allocation is given back (srun's
--kill-on-bad-exit and torchrun end the rest) and `launch.py status` shows the run as HUNG.
"""

from __future__ import annotations

import faulthandler
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from tinygpt.training import distributed as dist_mod

EXIT_HUNG = 76  # (75 is tinygpt.job.REQUEUE_EXIT)
ROLL_CALL_S = 10.0  # how long a stuck rank waits for the others to say they are stuck too (at most hang_timeout)


class RollCall(NamedTuple):
    silent: dict[int, str]  # {rank: node} of the ranks that did not say they are stuck
    writer: bool  # whether this rank writes the hung record
    peers: list[int]  # the pids of the silent ranks on this node, to kill once all is said


class Watchdog:
    def __init__(self, timeout_s: float, rank: int, world_size: int, metrics_path: Path,
                 store: Callable[[], object] | None, master: str = ""):
        """`store` opens a client of the rendezvous store on rank 0 (None when there is one rank), whose host
        is `master`. It watches from the first beat to `close` (start-up, compilation included, is not timed;
        the end of the run, its last collectives and the process group's teardown, is)."""
        self.timeout_s, self.rank, self.world_size, self.master = timeout_s, rank, world_size, master
        self.metrics_path, self._store = metrics_path, store
        self._last: float | None = None  # (None: not armed yet)
        self._step = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="tinygpt-watchdog", daemon=True)
        if timeout_s > 0:
            self._thread.start()

    def beat(self, step: int) -> None:
        """Something completed; `step` is the run's last completed step."""
        self._step, self._last = step, time.monotonic()

    def close(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(min(5.0, self.timeout_s / 4)):
            if self._last is not None and time.monotonic() - self._last > self.timeout_s:
                self._end()

    def _end(self) -> None:
        silent, writer, peers = self._bounded_roll_call()
        step, node = self._step, socket.gethostname()
        waiting = (f"; no answer from rank(s) {', '.join(str(r) for r in sorted(silent))} "
                   f"({', '.join(sorted(set(silent.values())))})" if silent else "")
        print(f"error: rank {self.rank} on {node}: no step, evaluation or checkpoint has completed for "
              f"{self.timeout_s:g} s (hang_timeout), after step {step}{waiting}; the stacks of this rank's "
              f"threads follow, and the job ends (resubmit it: it resumes from its newest checkpoint)",
              file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        if writer and not _said_already(self.metrics_path):
            record = {"step": step, "event": "hung", "node": node, "rank": self.rank,
                      "hang_timeout": self.timeout_s, "silent_ranks": sorted(silent),
                      "silent_nodes": sorted(set(silent.values()))}
            try:
                _append_line(self.metrics_path, json.dumps(record))
            except OSError as err:
                print(f"warning: could not write the hung record to {self.metrics_path}: {err}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        # Only now: a killed peer's sockets close, and this rank's main thread, waiting in a collective with it,
        # raises at once; had it been killed earlier, that error could end the process before the message above.
        for pid in peers:
            _end_peer(pid)
        os._exit(EXIT_HUNG)

    def _bounded_roll_call(self) -> RollCall:
        """The roll call, given up after a while: a store client connecting to a stopped rank 0 waits for ever,
        whatever its own time-out."""
        answer: list = []
        helper = threading.Thread(target=lambda: answer.append(self._roll_call()), daemon=True)
        helper.start()
        helper.join(min(ROLL_CALL_S, self.timeout_s) + 5)  # (+ a store operation's time, on a live store)
        return answer[0] if answer else self._master_silent()

    def _master_silent(self) -> RollCall:
        """What a rank can say when the store does not answer: rank 0, which hosts it, is the silent one, and
        rank 1 writes the record."""
        return RollCall({0: self.master or "the master"}, self.rank == 1, [])

    def _roll_call(self) -> RollCall:
        """Who did not say they are stuck, in the rendezvous store."""
        if self._store is None:
            return RollCall({}, True, [])
        try:
            store = self._store()
            store.set(f"tinygpt/stuck/{self.rank}", socket.gethostname())
            keys = {r: f"tinygpt/stuck/{r}" for r in range(self.world_size)}
            deadline = time.monotonic() + min(ROLL_CALL_S, self.timeout_s)
            while not store.check(list(keys.values())) and time.monotonic() < deadline:
                time.sleep(0.5)
            answered = [r for r, key in keys.items() if store.check([key])]
            silent, peers = {}, []
            for r in (r for r in keys if r not in answered):
                silent[r], pid = dist_mod.arrival(store, r)
                if silent[r] == socket.gethostname() and pid is not None:
                    peers.append(pid)
            return RollCall(silent, self.rank == min(answered), peers)
        except Exception:  # noqa: BLE001 (the store lives in rank 0: stopped, or its node is gone)
            return self._master_silent()


def _said_already(path: Path) -> bool:
    """Whether this life of the run has its `hung` record already: a stopped rank that Slurm wakes (SIGCONT)
    to end it finds its peers gone and would say the opposite of what happened."""
    from tinygpt.training.metrics import read

    records = read(path)
    return bool(records) and records[-1].get("event") == "hung"


def _append_line(path: Path, line: str) -> None:
    """`line` on a line of its own at the end of `path`, on disk: a rank stopped in the middle of writing a line
    leaves that line damaged (readers skip it), never this one."""
    with open(path, "a+b") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size:
            fh.seek(size - 1)
            if fh.read(1) != b"\n":
                fh.write(b"\n")
        fh.write(line.encode() + b"\n")
        fh.flush()
        os.fsync(fh.fileno())


def _end_peer(pid: int) -> None:
    """SIGKILL a silent rank on this node (a stopped process takes no other signal, and its state is in the
    newest checkpoint), so that the launcher does not wait out its own grace period for it."""
    try:
        if b"tinygpt" in Path(f"/proc/{pid}/cmdline").read_bytes():  # (still a trainer, not a reused pid)
            os.kill(pid, 9)
    except OSError:
        pass
