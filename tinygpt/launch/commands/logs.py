"""`launch.py logs SPEC [RUN]`: a run's Slurm logs (read/log_files.py finds them). By default the latest life of the
latest job is shown; `--all` shows every job's whole log; `--follow` prints the run's log as it grows.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from tinygpt.launch.console import stop_if_interrupted
from tinygpt.launch.errors import LaunchError
from tinygpt.launch.read import log_files, run_states
from tinygpt.launch.read.log_files import find_run, run_logs

if TYPE_CHECKING:
    from tinygpt.launch.manifest import Manifest


def run(manifest: Manifest, which: str | None, tail: int | None, every_life: bool, follow_it: bool) -> None:
    """The logs of the run `which` (or every run), or with `follow_it` the one run's log as it grows."""
    if follow_it:
        if which is None and len(manifest.runs) != 1:
            raise LaunchError("--follow: name the run to follow, e.g. `launch.py logs SPEC RUN --follow`")
        for text in log_files.follow(manifest, find_run(manifest, which)[0].index):
            sys.stdout.write(text)
            sys.stdout.flush()
            stop_if_interrupted()
        return
    show(manifest, which, tail, every_life, {r.index: r.nodes for r in run_states.collect(manifest)})


def show(manifest: Manifest, which: str | None, tail: int | None, every_life: bool, nodes: dict[int, str]) -> int:
    """Print the logs of one run (or all); return how many runs had a log."""
    found = 0
    for run in find_run(manifest, which):
        logs = run_logs(manifest, run.index, every_life)
        if not logs:
            print(f"==> run {run.name} (#{run.index}): never submitted to Slurm <==")
            continue
        for log in logs:
            found += bool(log.text)
            where = f" on {nodes[run.index]}" if nodes.get(run.index) and log.job == logs[-1].job else ""
            what = "whole log" if every_life else "latest life"
            print(f"==> run {run.name} (#{run.index}), job {log.job}{where}, {what}: {log.path} <==")
            lines = log.text.splitlines()
            print("\n".join(lines[-tail:] if tail else lines) if log.text else "(no log yet: the job has not started)")
    return found
