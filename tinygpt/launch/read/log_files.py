"""A run's Slurm logs, found from the manifest, one life at a time: what `logs` prints and the line `status`
shows for a run that failed.

Each job of a run writes one log (layout.py names them: sbatch's `<array>_<task>.out`, and for runs packed
into one task also `<array>_<task>.run<index>.out`, the run's own; submitit's `<task>_0_log.out` and `.err`
in its folder), and every requeue of that job appends a life to it, starting with the line the job writes
first (`tinygpt: run ...` from our batch script, `submitit INFO ... Starting` from submitit's).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from tinygpt.base import schema
from tinygpt.launch.errors import LaunchError
from tinygpt.launch.layout import packed_run_log, submitit_logs, task_log

if TYPE_CHECKING:
    from tinygpt.launch.manifest import Manifest, RunRecord

LIFE_START = re.compile(r"^(tinygpt: run \d+ \(.*\), job |submitit INFO .*Starting with JobEnvironment)", re.M)
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
            jobs.append((job_id, submitit_logs(Path(sub.folder), job_id)))
        else:
            own = [packed_run_log(manifest.logs_dir, job_id, index)] if sub.pack > 1 else []  # (packed runs)
            jobs.append((job_id, [task_log(manifest.logs_dir, job_id), *own]))
    return jobs


def follow(manifest: Manifest, index: int, poll_s: float = 0.5, check_s: float = 5.0) -> Iterator[str]:
    """Run `index`'s newest job's logs as they grow: what each poll (every `poll_s` seconds) found new, often "",
    until its job is over, as Slurm says when asked every `check_s` seconds (one more read after that). A
    LaunchError when the run was never submitted to Slurm."""
    from tinygpt.launch import manifest as manifest_mod
    from tinygpt.launch.read import run_states

    def ended() -> bool:  # (the manifest read again: a resubmission may have given the run a new job meanwhile)
        return run_states.collect(manifest_mod.load(manifest.path))[index].state.ended

    jobs = run_jobs(manifest, index)
    if not jobs:
        raise LaunchError(f"run {manifest.runs[index].name} was never submitted to Slurm: no log to follow")
    offsets = {path: 0 for path in jobs[-1][1]}
    last_check, done = -check_s, False  # (asked at the first poll: a run over already stops at once)
    while True:
        new = []
        for path in offsets:
            text = read(path)
            new.append(text[offsets[path]:])
            offsets[path] = max(offsets[path], len(text))
        yield "".join(new)
        if done:
            return
        if time.monotonic() - last_check >= check_s:
            last_check, done = time.monotonic(), ended()
        time.sleep(poll_s)


class RunLog(NamedTuple):
    """One log file of a job that ran the run, and what it holds (a life, or every life)."""

    job: str
    path: Path
    text: str  # "" while the job has not started


def run_logs(manifest: Manifest, index: int, every_life: bool = False) -> list[RunLog]:
    """The run's logs: its latest job's, the latest life of each (every job's whole logs with `every_life`),
    oldest first; an empty .err left out. None at all: never submitted to Slurm."""
    found = []
    for job_id, paths in run_jobs(manifest, index)[None if every_life else -1:]:
        for path in paths:
            text = read(path)
            if text or path.suffix != ".err":
                found.append(RunLog(job_id, path, text if every_life else latest_life(text)))
    return found


def latest_life(text: str) -> str:
    starts = [m.start() for m in LIFE_START.finditer(text)]
    return text[starts[-1]:] if starts else text


def read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def latest_text(manifest: Manifest, index: int) -> str | None:
    """What the run's latest job wrote in its latest life (each of that job's logs); None: it has no job."""
    jobs = run_jobs(manifest, index)
    return "\n".join(latest_life(read(path)) for path in jobs[-1][1]) if jobs else None


def last_error(manifest: Manifest, index: int) -> str | None:
    """The last line of the run's latest life that looks like the reason it ended (else its last line)."""
    text = latest_text(manifest, index)
    return None if text is None else error_line(text)


def error_line(text: str) -> str | None:
    """The last line of a life's text that looks like the reason it ended (else its last line)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
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
        names = [r.name for r in manifest.runs]
        raise LaunchError(f"RUN: no run `{which}` in sweep {manifest.name}{schema.suggest(which, names)}; give a run's "
                          f"name or number (see `launch.py status`)")
    return chosen
