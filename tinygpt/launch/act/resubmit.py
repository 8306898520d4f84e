"""`launch.py resubmit SPEC`: the runs of a sweep that ended badly, again, as one new array; nothing else.

The three tasks of a 64-task array that hit their time limit or a bad node go back to the queue with more
time, more memory or without that node; the 61 that finished are never touched. Each resubmitted run
resumes from its own checkpoints (its config and run directory are the ones it had), runs the code it
was first submitted with (the sbatch script names the sweep's code snapshot), and its earlier job, state
and nodes are kept in the manifest (`status` shows them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tinygpt.launch import manifest as manifest_mod
from tinygpt.launch.errors import LaunchError
from tinygpt.launch.heal import ends
from tinygpt.launch.manifest import Life
from tinygpt.launch.read.run_states import RESUBMIT_CHOICES, Row
from tinygpt.launch.spec.resources import Minutes, mem_problem, parse_mem_mb
from tinygpt.launch.submit import backends


def resubmit(path: Path, states: tuple[str, ...], time: str | None = None, mem: str | None = None,
             exclude: Sequence[str] = (), exclude_failed_nodes: bool = False, dry_run: bool = False) -> list[str]:
    """The runs of the sweep at manifest `path` whose latest job ended in one of `states`, sent again through its
    backend under the sweep's lock, with the changes asked for; the new jobs' ids (none for a dry run or no run)."""
    changes = parse_changes(time, mem, list(exclude))
    manifest_mod.load(path)  # (a sweep never launched is an error here, before the lock makes its folder)
    with manifest_mod.sweep_lock(path.parent):
        manifest = manifest_mod.load(path)  # (as it is once no other command can change it)
        rows = ends.collect_rows(manifest)
        if exclude_failed_nodes:
            bad = ends.failed_nodes(rows, manifest)
            print(f"nodes where a run ended in {' or '.join(ends.BAD_NODE_STATES)}: {', '.join(bad) or 'none'}")
            changes = parse_changes(time, mem, [*exclude, *bad])
        previous = choose(rows, states, changes)
        if not previous:
            return []
        return backends.of(manifest.backend).resubmit(manifest, [int(i) for i in previous], changes.options,
                                                      previous, dry_run)


@dataclass(frozen=True)
class Changes:
    """What the new jobs ask for differently: sbatch long options, e.g. {"time": "04:00:00"}."""

    options: dict[str, str]

    def sbatch_args(self) -> list[str]:
        return [f"--{key}={value}" for key, value in self.options.items()]


def parse_states(text: str) -> tuple[str, ...]:
    states = tuple(s.strip().upper() for s in text.split(",") if s.strip())
    unknown = [s for s in states if s not in RESUBMIT_CHOICES]
    if unknown or not states:
        raise LaunchError(f"--states: {', '.join(unknown) or repr(text)} not among {', '.join(RESUBMIT_CHOICES)}; "
                          f"give a comma-separated list, e.g. --states FAILED,TIMEOUT")
    return states


def parse_changes(time: str | None, mem: str | None, exclude: list[str]) -> Changes:
    options: dict[str, str] = {}
    if time is not None:
        try:
            minutes = Minutes.parse(time)
        except ValueError:
            minutes = -1
        if minutes is None or minutes < 1:
            raise LaunchError(f"--time: {time!r} is not a finite Slurm time of at least a minute; use HH:MM:SS, "
                              f"D-HH:MM:SS or minutes")
        options["time"] = str(minutes)
    if mem is not None:
        try:
            options["mem"] = f"{parse_mem_mb(mem)}M"
        except ValueError:
            raise LaunchError(f"--mem: {mem_problem(mem)}") from None
    nodes = [n for n in exclude if n]
    for node in nodes:
        if any(ch.isspace() or ch in "\x00'\"$;|&" for ch in node):
            raise LaunchError(f"--exclude: {node!r} is not a Slurm node list; use e.g. node3 or node[3-4]")
    if nodes:
        options["exclude"] = ",".join(dict.fromkeys(nodes))
    return Changes(options)


def select(rows: list[Row], states: tuple[str, ...]) -> list[Row]:
    """The runs whose latest job ended in one of `states` (a run whose directory says it finished is FINISHED,
    run_states.collect, whatever its task's end)."""
    return [row for row in rows if row.state.name in states]


def choose(rows: list[Row], states: tuple[str, ...], changes: Changes) -> dict[str, Life]:
    """The runs to submit again (`rows`: collect_rows'), each with its latest job ({run index: Life}), said in
    one line; empty when nothing matched. A backend sends them (backends.py)."""
    chosen = select(rows, states)
    if not chosen:
        print(f"nothing to resubmit: no run's latest job ended in {', '.join(states)}")
        return {}
    print(f"resubmitting {len(chosen)} of {len(rows)} run(s): "
          + ", ".join(f"{r.name} ({r.job_id} {r.state.name}{' on ' + r.nodes if r.nodes else ''})"
                      for r in chosen)
          + (f"; with {' '.join(changes.sbatch_args())}" if changes.options else ""))
    return {str(r.index): Life(job_id=r.job_id, state=r.state.name, nodes=r.nodes) for r in chosen}
