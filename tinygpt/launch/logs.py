"""`launch.py logs SPEC [RUN]`: a run's Slurm logs, found from the manifest, one life at a time.

Each job of a run writes one log (sbatch: `logs/<sweep>/<array>_<task>.out`, and for runs packed into one
task also `<array>_<task>.run<index>.out`, the run's own; submitit: `<task>_0_log.out` and `.err` in its
folder), and every requeue of that job appends a life to it, starting with the line
the job writes first (`tinygpt: run ...` from our batch script, `submitit INFO ... Starting` from
submitit's). By default the latest life of the latest job is shown; `--all` shows every job's whole log.
`last_error` gives the line `status` prints for a run that failed.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

from .errors import LaunchError
from .manifest import Manifest, RunRecord

LIFE_START = re.compile(r"^(tinygpt: run \d+ |submitit INFO .*Starting with JobEnvironment)", re.M)
# What says why a run ended, best first: our own messages, a Python exception, then Slurm's words.
ERROR_LINES = (re.compile(r"^(error: |tinygpt: setup failed)"),
               re.compile(r"^[\w.]*(Error|Exception|Interrupt)\b"),
               re.compile(r"error|killed|oom|out of memory|time limit|cancelled", re.I))


def run_jobs(manifest: Manifest, index: int) -> list[tuple[str, list[Path]]]:
    """(job id, its log files) of every job that ran run `index`, oldest first."""
    jobs = []
    for sub in manifest.slurm_submissions():
        if index not in sub.indices:
            continue
        job_id = sub.task_of(index)
        if sub.folder:  # submitit
            folder = Path(sub.folder)
            jobs.append((job_id, [folder / f"{job_id}_0_log.out", folder / f"{job_id}_0_log.err"]))
        else:
            logs = Path(manifest.logs_dir)
            own = [logs / f"{job_id}.run{index}.out"] if sub.pack > 1 else []  # (packed runs)
            jobs.append((job_id, [logs / f"{job_id}.out", *own]))
    return jobs


def latest_life(text: str) -> str:
    starts = [m.start() for m in LIFE_START.finditer(text)]
    return text[starts[-1]:] if starts else text


def read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def last_error(manifest: Manifest, index: int) -> str | None:
    """The last line of the run's latest life that looks like the reason it ended (else its last line)."""
    jobs = run_jobs(manifest, index)
    if not jobs:
        return None
    lines = [line.strip() for path in jobs[-1][1] for line in latest_life(read(path)).splitlines() if line.strip()]
    for pattern in ERROR_LINES:
        found = [line for line in lines if pattern.search(line)]
        if found:
            return found[-1]
    return lines[-1] if lines else None


def find_run(manifest: Manifest, which: str | None) -> list[RunRecord]:
    if which is None:
        return manifest.runs
    chosen = manifest.find(which)
    if not chosen:
        from tinygpt.config import suggest

        names = [r.name for r in manifest.runs]
        raise LaunchError(f"RUN: no run `{which}` in sweep {manifest.name}{suggest(which, names)}; give a run's "
                          f"name or number (see `launch.py status`)")
    return chosen


def show(manifest: Manifest, which: str | None, tail: int | None, every_life: bool, nodes: dict[int, str]) -> int:
    """Print the logs of one run (or all); return how many runs had a log."""
    found = 0
    for run in find_run(manifest, which):
        jobs = run_jobs(manifest, run.index)
        if not jobs:
            print(f"==> run {run.name} (#{run.index}): never submitted to Slurm <==")
            continue
        for job_id, paths in jobs if every_life else jobs[-1:]:
            for path in paths:
                text = read(path)
                if not text and path.suffix == ".err":
                    continue
                found += bool(text)
                where = f" on {nodes[run.index]}" if nodes.get(run.index) and job_id == jobs[-1][0] else ""
                what = "whole log" if every_life else "latest life"
                print(f"==> run {run.name} (#{run.index}), job {job_id}{where}, {what}: {path} <==")
                body = text if every_life else latest_life(text)
                lines = body.splitlines()
                print("\n".join(lines[-tail:] if tail else lines) if text else "(no log yet: the job has not started)")
    return found


def follow(manifest: Manifest, which: str, ended) -> None:
    """Print the run's newest log as it grows, until `ended()` says its job is over (or Ctrl-C)."""
    run = find_run(manifest, which)[0]
    jobs = run_jobs(manifest, run.index)
    if not jobs:
        raise LaunchError(f"--follow: run {run.name} was never submitted to Slurm")
    offsets = {path: 0 for path in jobs[-1][1]}
    last_check, done = 0.0, False
    while True:
        for path in offsets:
            text = read(path)
            if len(text) > offsets[path]:
                sys.stdout.write(text[offsets[path]:])
                sys.stdout.flush()
                offsets[path] = len(text)
        if done:
            return
        if time.monotonic() - last_check > 5:
            last_check, done = time.monotonic(), ended()  # (one more read after the end, then stop)
        time.sleep(0.5)
