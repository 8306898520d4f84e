"""How each run of a sweep ended, in a retry policy's words: the kind of end and the line that says why.

    finished        its program ended well (Slurm's COMPLETED, or its run directory says so)
    time_limit      Slurm ended it at its time limit (TIMEOUT): it did not save and requeue itself in time; or
                    it FAILED as its program died of the stop signal Slurm sends before the limit (its supervisor,
                    node/supervise.py, says UNSAVED) while no task of it failed on its own
    out_of_memory   OUT_OF_MEMORY, or a job that FAILED with slurmstepd's word that it was killed for its memory
                    (a cluster that enforces memory by polling, JobAcctGatherParams=OverMemoryKill, ends it
                    FAILED with "slurmstepd: error: Exceeded job memory limit" in its log)
    node_failure    a node it ran on failed (NODE_FAIL, BOOT_FAIL)
    hung            the watchdog or the heartbeat found ranks that stopped answering (HUNG)
    preempted       Slurm ended it to make room (PREEMPTED)
    cancelled       a person cancelled it (CANCELLED), or it ran past its deadline (DEADLINE)
    program         it ended with an error of its own (FAILED): a Python error, bad data, a NaN loss
    unknown         Slurm keeps no record of its job
    live            it has not ended (pending, running, requeued)

Each kind is declared once, with the states that say it, in spec/retry.py's ENDS; this module reads them, and
tells apart by the log what a state alone does not. The same for our trainer and for a program of the user's:
Slurm's state first, then, for a FAILED job only, the latest life of the run's log (read/log_files.py), of which
only the lines Slurm's processes and the launcher wrote count: what a program prints is never evidence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tinygpt.launch.errors import LaunchError, SlurmAway
from tinygpt.launch.manifest import BACKENDS
from tinygpt.launch.node.supervise import FAILED, UNSAVED
from tinygpt.launch.read import log_files
from tinygpt.launch.read.run_states import Row, collect
from tinygpt.launch.slurm.slurm_cli import RETRY
from tinygpt.launch.spec.retry import ENDS

if TYPE_CHECKING:
    from tinygpt.launch.manifest import Manifest

BY_STATE = {state: kind.name for kind in ENDS.values() for state in kind.states}
# what --exclude-failed-nodes (and a policy's retry) keeps away from
BAD_NODE_STATES = tuple(state for kind in ENDS.values() if kind.away_from_its_nodes for state in kind.states)
# The evidence read from a life's log: lines that Slurm's own processes (slurmstepd when OverMemoryKill or the
# cgroup plugin ends a step for its memory, srun) and the run's supervisor (node/supervise.py) wrote, each known by
# how its line starts; never what the program printed (a program that prints "CUDA out of memory" and exits 1 failed).
MEMORY_KILL = re.compile(r"^(slurmstepd|srun)(-[\w.-]+)?: error: .*"
                         r"(exceeded (job |step )?memory limit|out[- ]of[- ]memory|oom[-_ ]kill)", re.I | re.M)
UNSAVED_LINE = re.compile(rf"^tinygpt: run \S+ {re.escape(UNSAVED)}", re.M)
FAILED_LINE = re.compile(rf"^tinygpt: run \S+ {re.escape(FAILED)}", re.M)


@dataclass(frozen=True)
class End:
    kind: str
    line: str  # why: the run's last error line where its log has one, else Slurm's state


def of_run(row: Row, manifest: Manifest) -> End:
    """How run `row` ended (its latest job)."""
    state = row.state
    if not state.ended:
        return End("unknown" if row.source == "run dir" else "live", str(state))
    kind = BY_STATE.get(state.name, "program")
    if kind == "finished":
        return End(kind, str(state))
    life = log_files.latest_text(manifest, row.index) or ""
    if kind == "program":  # (FAILED: Slurm says no more; a CANCELLED is a person's, whatever the program did then)
        kind = ("out_of_memory" if MEMORY_KILL.search(life) else "program" if FAILED_LINE.search(life)
                else "time_limit" if UNSAVED_LINE.search(life) else kind)
    return End(kind, log_files.error_line(life) or str(state))


def failed_nodes(rows: list[Row], manifest: Manifest) -> list[str]:
    """The nodes on which a run of the sweep ended in NODE_FAIL, or HUNG (the nodes of its silent ranks), now
    or in an earlier submission."""
    nodes = [r.nodes for r in rows if r.state.name in BAD_NODE_STATES and r.nodes]
    for sub in manifest.submissions:
        nodes += [b.nodes for b in (sub.previous or {}).values() if b.state in BAD_NODE_STATES and b.nodes]
    return list(dict.fromkeys(nodes))


def collect_rows(manifest: Manifest, who: str = "resubmit: ") -> list[Row]:
    """The sweep's runs, with how Slurm says their jobs ended: what resubmit and a retry policy choose from
    (`who` heads the messages). Fails closed: while a daemon of Slurm's does not answer, SlurmAway."""
    if manifest.backend not in BACKENDS or not manifest.slurm_submissions():
        raise LaunchError(f"{who}no job of this sweep was submitted to Slurm; launch it first (runs of --local are "
                          f"run again with --local)")
    rows = collect(manifest)
    if rows.unheard:
        raise SlurmAway(f"{who}{'; '.join(rows.unheard)}, so which runs failed cannot be told for sure; {RETRY}")
    if rows and all(r.source == "run dir" for r in rows if r.job_id != "-"):
        raise LaunchError(f"{who}Slurm does not say how the sweep's jobs ended (no sacct or squeue answer); run it "
                          f"where Slurm's commands work")
    return rows
