"""`launch.py list [--workdir DIR] [--json]`: every sweep under a work directory (status/listing.py), a line each:
its name, when it last changed, its cluster and runs by state, or why it cannot be read; with --json, the
listing's document."""

from __future__ import annotations

import time
from pathlib import Path

from tinygpt.launch.status.listing import SweepEntry, listing


def show(workdir: Path, as_json: bool) -> int:
    found = listing(workdir)
    if as_json:
        print(found.model_dump_json(indent=2, exclude_none=True))
        return 0
    if not found.sweeps:
        print(f"no sweep under {found.workdir} (its jobs/<sweep>/manifest.json); launch one, or give --workdir")
        return 0
    width = max(len(e.sweep) for e in found.sweeps)
    for e in found.sweeps:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.changed)) if e.changed is not None else "-" * 16
        print(f"{e.sweep:<{width}}  {when}  {_said(e)}{'  on ' + e.where if e.where else ''}")
    return 0


def _said(e: SweepEntry) -> str:
    if e.problem is not None:
        return f"cannot be read: {e.problem}"
    states = ", ".join(f"{n} {state}" for state, n in sorted((e.states or {}).items()))
    return (f"{e.cluster or '-'}  {e.runs} run(s): {states}"
            + (f"  (not heard: {'; '.join(e.unheard)})" if e.unheard else ""))
