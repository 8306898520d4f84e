"""A spec launched again over its sweep: each of its runs matched with the manifest's by name and by identity (what
defines the run: the trainer or the command's words, and its values), so that only what is new is submitted.

    finished   its job completed, or its directory says it finished (sacct may have long forgotten it)
    running, queued   live: left alone
    failed     its latest job ended badly: left for `resubmit`, which chooses how to send it again
    new        not in the manifest (or written there by a dry run, never submitted): submitted
    changed    the same name with another identity, or other code where the spec's `code_counts` asks: refused,
               unless --fresh (its directory is moved aside, not trained over, and it is submitted as new)
    gone       in the manifest, no longer in the spec: kept there (status shows it), and named with how to stop it

The manifest's runs keep their indices and their configs (a live task reads its record when it starts), the new
ones are added after them, and the manifest's shared `base` becomes what every run, old and new, has in common.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tinygpt.launch.errors import LaunchError, SlurmAway
from tinygpt.launch.read.run_states import Rows, collect, jobs_of, read_progress
from tinygpt.launch.slurm import slurm_cli
from tinygpt.launch.slurm.slurm_cli import RETRY
from tinygpt.launch.submit.plan import Records

if TYPE_CHECKING:
    from tinygpt.launch.manifest import Manifest
    from tinygpt.launch.spec.sweep import Sweep

LIVE = {"PENDING": "queued", "REQUEUED": "queued", "CONFIGURING": "queued", "SUSPENDED": "queued",
        "RESIZING": "queued", "REQUEUE_HOLD": "queued", "RUNNING": "running", "COMPLETING": "running"}
FINISHED = ("COMPLETED", "FINISHED")
SHOWN = 40  # rows listed one by one; a larger sweep shows its counts and the rows that are not finished


@dataclass
class Relaunch:
    rows: list[tuple[str, str, str]] = field(default_factory=list)  # (run, what, detail)
    records: list[dict[str, Any]] = field(default_factory=list)  # the manifest's runs: index, name, config, ...
    submit: list[int] = field(default_factory=list)  # the runs to submit now, by index
    aside: list[tuple[Path, Path]] = field(default_factory=list)  # changed runs' directories: (from, to)

    def merged(self) -> Records:
        """The manifest's runs to write: the values every run has in common once, each record with its own."""
        configs = [r["config"] for r in self.records]
        base = dict(configs[0]) if configs else {}
        for config in configs[1:]:
            base = {k: v for k, v in base.items() if k in config and config[k] == v}
        return Records(base, [{**{k: v for k, v in r.items() if k != "config"},
                               "own": {k: v for k, v in r["config"].items() if k not in base}}
                              for r in self.records], self.submit)


def identity(argv: list[str] | None, config: dict[str, Any], max_steps: int | None) -> str:
    """What defines a run: the command's words (None: the trainer) and its values."""
    text = json.dumps({"argv": argv, "config": config, "max_steps": max_steps}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def compare(previous: Manifest, sweep: Sweep, fresh: bool, code: str | None = None) -> Relaunch:
    """How each run of `sweep` stands against the sweep launched before (`previous`), and what to submit; with
    `code` (the digest of the code it would be submitted with, when spec.code_counts), a run last written for
    other code is changed too. A LaunchError naming each changed run without --fresh (or a live one with it);
    SlurmAway when Slurm cannot say which runs are live."""
    states = _states(previous)
    was = previous.command.argv if previous.command else None
    now = sweep.command.argv if sweep.command else None
    before = {r.name: r for r in previous.runs}
    rel = Relaunch(records=[{"index": r.index, "name": r.name, "config": {**previous.base, **r.own},
                             "out_dir": r.out_dir, "max_steps": r.max_steps, "code": r.code} for r in previous.runs])
    refused = []
    for run in sweep.runs:
        config, old = {**run.shared, **run.own}, before.get(run.name)
        what, job = states.get(run.name, ("new", ""))
        if old is None or what == "new":
            index = old.index if old else len(rel.records)
            record = {"index": index, "name": run.name, "config": config, "out_dir": run.out_dir,
                      "max_steps": run.max_steps}
            rel.records[index:index + 1] = [record]
            rel.submit.append(index)
            rel.rows.append((run.name, "new", "submitted now"))
        elif (other_values := identity(was, {**previous.base, **old.own}, old.max_steps)
              != identity(now, config, run.max_steps)) or code is not None and old.code != code:
            if not fresh or what in ("running", "queued"):
                why = "other values, or another command" if other_values else "other code, as code_counts asks"
                refused.append(f"{run.name} ({what}{' ' + job if job else ''}; {why})")
                continue
            aside = Path(f"{old.out_dir}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
            rel.aside.append((Path(old.out_dir), aside))
            rel.records[old.index] = {**rel.records[old.index], "config": config, "max_steps": run.max_steps}
            rel.submit.append(old.index)
            rel.rows.append((run.name, "changed", f"to start fresh; its old directory kept as {aside.name}"))
        else:
            rel.rows.append((run.name, what, job))
    if refused:
        raise LaunchError(_changed_message(refused, sweep.name))
    names = {run.name for run in sweep.runs}
    if was != now and (gone := [old.name for old in previous.runs if old.name not in names]):
        # (the manifest holds one program: a run the spec no longer names would be resubmitted with this one's)
        raise LaunchError(f"relaunch: sweep `{sweep.name}` runs {shlex.join(was or ['the trainer'])}, and this spec "
                          f"{shlex.join(now or ['the trainer'])}; its runs {', '.join(gone[:5])}"
                          f"{' ...' if len(gone) > 5 else ''} are not in this spec and would be resubmitted with this "
                          f"program. Nothing was written: give this spec another `name`")
    for old in previous.runs:
        if old.name not in names:
            what, job = states.get(old.name, ("new", ""))
            stop = f"; stop it with `scancel {job}`" if what in ("running", "queued") else ""
            rel.rows.append((old.name, "gone", f"not in the spec: kept in the manifest ({what} {job}){stop}"))
    return rel


def _states(previous: Manifest) -> dict[str, tuple[str, str]]:
    """{run name: (finished | running | queued | failed STATE | new, its job)}, from Slurm and the run's own
    directory; SlurmAway rather than a guess when Slurm does not answer."""
    jobs = sorted(set(previous.task_job_ids().values()))
    if jobs:
        queued(jobs, previous.name)  # (fails closed: squeue must answer before anything is called not live)
    rows = collect(previous) if jobs else Rows()
    if getattr(rows, "unheard", None):
        raise SlurmAway(f"relaunch: {'; '.join(rows.unheard)}, so which runs are live cannot be told for sure; "
                        f"nothing was written; {RETRY}")
    states = {}
    for row in rows:
        if row.source == "waves":  # (submitted by the heal job in a wave to come: not new)
            states[row.name] = ("waiting for a wave", "")
            continue
        if row.job_id == "-":
            continue
        name = row.state.name
        if name in FINISHED or read_progress(Path(row.run_dir)).get("event") == "finished":
            states[row.name] = ("finished", row.job_id)
        elif name in LIVE:
            states[row.name] = (LIVE[name], row.job_id)
        else:
            states[row.name] = (f"failed {row.state}", row.job_id)
    return states


def queued(jobs: list[str], name: str) -> dict:
    """squeue's word on the sweep's jobs; a LaunchError when it has none (the guards fail closed)."""
    slurm_cli.require_controller()
    states = slurm_cli.squeue_states(jobs_of(jobs))
    if states is None:
        raise LaunchError(f"sweep `{name}` has jobs on Slurm, and squeue could not say whether they are still "
                          f"live (it is not on PATH, or it failed); they read this sweep's files when they start, "
                          f"so nothing was written; try again when `squeue` answers, or launch the spec under "
                          f"another `name`")
    return states


def _changed_message(refused: list[str], name: str) -> str:
    return (f"relaunch: run(s) of sweep `{name}` that the spec now defines otherwise: {', '.join(refused)}. "
            f"Nothing was written. Their directories hold what the old definition "
            f"trained: give the changed runs other names (a new `name` for the sweep), or launch with --fresh to "
            f"move each such directory aside and start the run anew (a live one: cancel it first)")


def show(rel: Relaunch, say=print) -> None:
    """The table of a relaunch: every run when it is small, else its counts and the runs that are not finished."""
    counts: dict[str, int] = {}
    for _, what, _ in rel.rows:
        counts[what.split(" ")[0]] = counts.get(what.split(" ")[0], 0) + 1
    say("relaunch: " + ", ".join(f"{n} {what}" for what, n in counts.items()))
    listed = rel.rows if len(rel.rows) <= SHOWN else [r for r in rel.rows if r[1] != "finished"][:SHOWN]
    width = max((len(r[0]) for r in listed), default=0)
    for run, what, detail in listed:
        say(f"  {run:<{width}}  {what}{'  ' + detail if detail else ''}")
    if len(listed) < len(rel.rows):
        say(f"  ... {len(rel.rows) - len(listed)} more not shown (`status` lists every run)")
