"""`list --json` and the library's `list_sweeps()`: every sweep under a work directory, an entry each, by name:
its cluster, its runs by state and when it last changed (its manifest or its submissions, the newer). A sweep
this laptop launched over SSH is asked of its login node. A manifest that cannot be read is an entry with why,
never skipped. Its schema is these models (`launch.py schema list`); fields are only ever added within one format.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tinygpt.launch import manifest as manifest_mod
from tinygpt.launch.errors import LaunchError
from tinygpt.launch.layout import REMOTE_RECORD, SUBMISSIONS
from tinygpt.launch.read.run_states import collect


class SweepEntry(BaseModel):
    """One sweep of the work directory. A field not known is left out of the JSON (null in Python)."""

    model_config = ConfigDict(extra="forbid")

    sweep: str = Field(description="the sweep's name (its folder under jobs/)")
    manifest: str | None = Field(None, description="its manifest's path (none for a sweep on a login node)")
    changed: float | None = Field(None, description="when its manifest or submissions last changed, seconds since "
                                                    "the epoch")
    cluster: str | None = Field(None, description="the cluster profile it was launched with")
    runs: int | None = Field(None, description="how many runs it has")
    states: dict[str, int] | None = Field(None, description="its runs by state name")
    unheard: list[str] | None = Field(None, description="Slurm's daemons that did not answer (the states may be "
                                                        "older than they look)")
    where: str | None = Field(None, description="the login node a sweep launched from this laptop lives on")
    problem: str | None = Field(None, description="why it cannot be read; no other field but its name then")


class SweepList(BaseModel):
    """The document `list --json` prints."""

    model_config = ConfigDict(extra="forbid")

    format: Literal[1] = Field(description="this document's format")
    workdir: str = Field(description="the work directory listed")
    sweeps: list[SweepEntry]


def listing(workdir: Path) -> SweepList:
    """Every sweep of `workdir` now (asks Slurm, and a login node for a sweep launched from this laptop)."""
    workdir = workdir.resolve()
    found = [_entry(path) for path in sorted((workdir / "jobs").glob("*/manifest.json"))]
    if any((workdir / "jobs").glob(f"*/{REMOTE_RECORD}")):
        from tinygpt.launch.remote import laptop

        found += [SweepEntry(**e) for e in laptop.sweeps_there(workdir)]
    return SweepList(format=1, workdir=str(workdir), sweeps=sorted(found, key=lambda e: e.sweep))


def _entry(path: Path) -> SweepEntry:
    changed = max(p.stat().st_mtime for p in (path, path.with_name(SUBMISSIONS)) if p.exists())
    try:
        manifest = manifest_mod.load(path)
    except LaunchError as err:
        return SweepEntry(sweep=path.parent.name, manifest=str(path), changed=changed, problem=str(err))
    rows = collect(manifest)
    return SweepEntry(sweep=path.parent.name, manifest=str(path), changed=changed, cluster=manifest.cluster,
                      runs=len(rows), states=dict(Counter(r.state.name for r in rows)), unheard=list(rows.unheard))
