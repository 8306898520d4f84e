"""A sweep's report, runs/<sweep>/report.md: every run's loss curves, final losses, samples and attention maps
(tinygpt/report.py), an Optuna search's trials first, and how the jobs used their allocation last. Made by
`launch.py report`, by the report step of a job chain on a node, and by `--local --chain`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tinygpt.launch.errors import LaunchError
from tinygpt.launch.read import efficiency, study

if TYPE_CHECKING:
    from tinygpt.launch.manifest import Manifest


def make(manifest: Manifest, prompt: str | None) -> int:
    """The sweep report of a manifest's runs (also the report step of a job chain, on a node); a program of the
    user's has its own (command_report.py)."""
    if manifest.command is not None:
        from tinygpt.launch.read import command_report

        return command_report.make(manifest, _efficiency_section(manifest))
    from tinygpt import report  # (numpy and matplotlib: only when a report is made)

    out_dir = manifest.dirs.runs
    runs = [(Path(r.out_dir), r.name) for r in manifest.runs]
    varying = sorted({k for r in manifest.runs for k in r.own})
    sections = [_efficiency_section(manifest)]
    if manifest.search:  # an Optuna search: its trials are the runs
        trials = study.trials(manifest)
        runs = [(Path(t["run dir"]), f"trial={t['trial']}") for t in trials if t["run dir"]]
        varying = sorted(manifest.search.dists)
        out_dir.mkdir(parents=True, exist_ok=True)
        sections.insert(0, study.report_section(trials, out_dir))
    return report.report_command(runs, out_dir, f"sweep {manifest.name}", varying, prompt,
                                 "\n".join(s for s in sections if s) or None)


def _efficiency_section(manifest: Manifest) -> str | None:
    """The report's efficiency table, when the sweep ran on Slurm and accounting answers."""
    if not manifest.slurm_submissions():
        return None
    try:
        return efficiency.markdown(efficiency.table_rows(manifest))
    except LaunchError as err:
        print(f"note: the report has no efficiency table: {err}", file=sys.stderr)
        return None
