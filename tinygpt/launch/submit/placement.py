"""`placement: soonest`: of the ways a spec gives to run its jobs, the one whose first job Slurm says would start
first. Each way's first batch script is written to a folder of its own and asked of `sbatch --test-only` (nothing
is submitted, nothing of the sweep written); its words are printed.

The spec's first way is its choice: kept on a tie, and kept where Slurm gives no start time for a way it would
take (the ways cannot then be compared). A way the live cluster cannot run (preflight.py says why) is left out.
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from tinygpt.launch.layout import REPO_ROOT
from tinygpt.launch.slurm import slurm_cli
from tinygpt.launch.submit.plan import script_text

if TYPE_CHECKING:
    from tinygpt.launch.spec.resources import Resources
    from tinygpt.launch.spec.sweep import Sweep

START = re.compile(r"^would start at ([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2})")


def soonest(sweep: Sweep, refused: dict[int, str]) -> Resources:
    """The resources of the way whose first job would start first, the estimates printed (`placement:` lines);
    `refused`: the ways the live cluster cannot run, by their index, and why."""
    starts: dict[int, datetime | None] = {}
    with tempfile.TemporaryDirectory(prefix="tinygpt-placement-") as folder:
        for i, way in enumerate(sweep.placement):
            if i in refused:
                print(f"placement: {way.said}: not on this cluster: {refused[i]}")
                continue
            ok, start, said = _estimate(dataclasses.replace(sweep, resources=way.resources),
                                        Path(folder) / f"way-{i}.sbatch")
            print(f"placement: {way.said}: {said}")
            if ok:
                starts[i] = start
    if not starts:  # (none fits: the first is kept, and the check names its problems)
        return sweep.placement[0].resources
    if unknown := [i for i, start in starts.items() if start is None]:
        chosen = min(starts)
        why = (f"the first of the spec's ways that Slurm would take (it gave no start time for "
               f"{sweep.placement[unknown[0]].said}, so the ways cannot be compared)")
    else:
        chosen = min(starts, key=lambda i: (starts[i], i))
        tied = [i for i in starts if starts[i] == starts[chosen]]
        why = "it would start first" if len(tied) == 1 else "the spec lists it first of those that would start first"
    print(f"placement: chose {sweep.placement[chosen].said}, as {why}")
    return sweep.placement[chosen].resources


def _estimate(sweep: Sweep, path: Path) -> tuple[bool, datetime | None, str]:
    """Whether Slurm would take the sweep's first job, when it would start it (None: no time given), its words."""
    path.write_text(script_text(sweep, REPO_ROOT, path, "0", 0, len(sweep.runs)))
    ok, said = slurm_cli.sbatch_test_only(str(path))
    if not ok:
        return False, None, f"Slurm would not take it: {said}"
    found = START.match(said)
    return True, datetime.fromisoformat(found[1]) if found else None, said
