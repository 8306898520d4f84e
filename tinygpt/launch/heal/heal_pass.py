"""`launch.py heal SPEC`: one pass of a sweep's retry policy; what its heal job runs after each round.

Under the sweep's lock (a `resubmit` by hand beside it waits its turn, so no run is sent twice) it reads how
each run's newest job ended (heal/ends.py), sends again those the policy allows as the next round, with
what they need (heal/decide.py), and submits the heal job again after every job still to end. When
nothing is left to end, it writes the sweep's summary (runs/<sweep>/summary.md) and sends it where the
policy's `notify` says, once. While Slurm's controller or its accounting does not answer, or another command
holds the lock, it waits and asks again: it never decides from no answer. A sweep `cancel` has cancelled
sends nothing more.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING

from tinygpt.base import durable
from tinygpt.launch import manifest as manifest_mod
from tinygpt.launch.errors import LaunchError, SlurmAway, SweepBusy
from tinygpt.launch.heal import decide, waves
from tinygpt.launch.heal import job as heal_job
from tinygpt.launch.heal.decide import GIVE_UP, SEND, WAIT, Decision
from tinygpt.launch.heal.ends import collect_rows
from tinygpt.launch.manifest import Life
from tinygpt.launch.read import efficiency
from tinygpt.launch.read.run_states import jobs_of
from tinygpt.launch.spec.retry import RetryPolicy
from tinygpt.launch.submit import backends

if TYPE_CHECKING:
    from pathlib import Path

    from tinygpt.launch.manifest import Manifest, WavesRecord

WAIT_S = 5.0  # between two tries while Slurm does not answer or the sweep is locked
NOTIFY_TIMEOUT_S = 300


def run(path: Path, wait_s: float = WAIT_S) -> int:
    manifest_mod.load(path)  # (a sweep never launched is an error here, before the lock makes its folder)
    while True:
        try:
            with manifest_mod.sweep_lock(path.parent):
                return one_pass(manifest_mod.load(path))
        except (SlurmAway, SweepBusy) as err:
            print(f"heal: waiting {wait_s:.0f} s, then asking again: {err}", flush=True)
            time.sleep(wait_s)


def one_pass(manifest: Manifest) -> int:
    policy = RetryPolicy.of(manifest.retry)
    record = manifest_mod.load_waves(manifest.dirs)
    if policy is None and record is None:
        print(f"heal: sweep {manifest.name} has no retry policy and no waves: nothing to do")
        return 0
    if manifest.dirs.cancelled.exists():
        print(f"heal: sweep {manifest.name} was cancelled: nothing is sent")
        return 0
    if superseded(manifest):
        print("heal: a later heal job of this sweep was submitted already: nothing to do")
        return 0
    with _no_sigterm():  # (Slurm's SIGTERM between a submission and its record would lose the record)
        if record is not None and manifest.waiting(record):
            manifest = _next_wave(manifest, record)
        rows = collect_rows(manifest, who="")
        waves.report_after_the_last(manifest, record, rows)
        if policy is None:
            return _follow_waves(manifest, rows, 1)
        usage = _usage(manifest) if policy.mem_from_peak else {}
        decisions = decide.decide(manifest, rows, usage, policy)
        for d in decisions:
            if d.action in (SEND, GIVE_UP):
                print(f"heal: {d.said()}", flush=True)
        sent, refused = send(manifest, [d for d in decisions if d.action == SEND])
        decisions = [refused.get(d.row.index, d) for d in decisions]
        next_round = max((d.round + (d.action == SEND) for d in decisions), default=1)
        if manifest.waiting():
            manifest = manifest_mod.load(manifest.path)  # (with the runs just sent again)
            return _follow_waves(manifest, collect_rows(manifest, who="") if sent else rows, next_round)
        live = jobs_of([d.row.job_id for d in decisions if d.action == WAIT])
        if sent or live:
            job = heal_job.submit(manifest, heal_job.after_all([*sent, *live]), next_round)
            print(f"heal: heal job {job} follows round {next_round} (after {', '.join([*sent, *live])})")
            return 0
    finish(manifest, decisions, policy.notify)
    return 0


def _next_wave(manifest: Manifest, record: WavesRecord) -> Manifest:
    """The runs waiting for a wave that fit the queue now, submitted; the manifest with their records."""
    places, tightest = waves.room(record, waves.margin_now(manifest, record))
    waiting = waves.tasks_of(record, set(manifest.waiting(record)))
    print(f"heal: {waves.said(record, waiting, places, tightest)}", flush=True)
    ids = waves.feed(manifest, record, places)
    if ids:
        print(f"heal: sent a wave as job(s) {', '.join(ids)}", flush=True)
    return manifest_mod.load(manifest.path)


def _follow_waves(manifest: Manifest, rows: list, round: int) -> int:
    """The heal job again while runs wait for a wave: when the first live task ends; none when nothing waits."""
    if not manifest.waiting():
        print(f"heal: every run of sweep {manifest.name} went out: nothing more to feed")
        return 0
    when = waves.after_the_first_of(waves.live_tasks(rows))
    job = heal_job.submit_until_taken(manifest, when, round)
    print(f"heal: heal job {job} sends the next wave ({' '.join(when)})")
    return 0


def superseded(manifest: Manifest) -> bool:
    """Whether a heal job was submitted after this one (this job, requeued, runs its pass again)."""
    mine = os.environ.get("SLURM_JOB_ID")
    heals = heal_job.heal_jobs(manifest)
    return mine in heals and heals.index(mine) < len(heals) - 1


def send(manifest: Manifest, chosen: list[Decision]) -> tuple[list[str], dict[int, Decision]]:
    """The chosen runs as the next round, one array per distinct request: the new job ids, and the runs whose
    request Slurm refused (given up, with its words)."""
    groups: dict[tuple, list[Decision]] = {}
    for d in chosen:
        groups.setdefault((tuple(sorted(d.options.items())), d.round + 1), []).append(d)
    ids, refused = [], {}
    for (options, round_), group in groups.items():
        previous = {str(d.row.index): Life(job_id=d.row.job_id, state=d.row.state.name, nodes=d.row.nodes,
                                           end=d.end.kind) for d in group}
        try:
            ids += backends.of(manifest.backend).resubmit(manifest, [d.row.index for d in group], dict(options),
                                                          previous, False, round_)
        except SlurmAway:
            raise
        except LaunchError as err:  # (Slurm's own limits, which neither the profile nor the policy knew)
            print(f"heal: {err}", flush=True)
            refused |= {d.row.index: dataclasses.replace(d, action=GIVE_UP, why=f"Slurm refused its next round: {err}")
                        for d in group}
        manifest = manifest_mod.load(manifest.path)  # (with the submission just recorded)
    return ids, refused


def finish(manifest: Manifest, decisions: list[Decision], notify) -> None:
    """The summary, written, and sent once (a heal job requeued after it sent it sends nothing)."""
    if manifest.dirs.summary.exists():  # (launch removes an earlier launch's)
        print(f"heal: the summary was written already: {manifest.dirs.summary}")
        return
    text = decide.summary(manifest, decisions)
    headline = decide.headline(manifest, decisions)
    durable.write(manifest.dirs.summary, text)
    print(text, flush=True)
    if notify is not None and notify.mail:
        job = heal_job.mail(manifest, headline, notify.mail)
        print(f"heal: the summary's mail goes to {notify.mail} at the end of job {job}")
    if notify is not None and notify.command:
        _run_command(manifest, notify.command, headline, text)


def _run_command(manifest: Manifest, argv: list[str], headline: str, text: str) -> None:
    values = {"summary": str(manifest.dirs.summary), "sweep": manifest.name, "headline": headline}
    words = [word.format_map(values) for word in argv]
    try:
        done = subprocess.run(words, input=text, text=True, timeout=NOTIFY_TIMEOUT_S, check=False)
        print(f"heal: notify.command ended {done.returncode}")
    except (OSError, subprocess.TimeoutExpired) as err:
        print(f"heal: notify.command could not be run: {err}")


def _usage(manifest: Manifest) -> dict:
    found = efficiency.of_sweep(manifest)
    return {job: u for _, job, u in found or [] if u is not None}


@contextmanager
def _no_sigterm():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
