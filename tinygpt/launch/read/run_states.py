"""What each run of a sweep is doing: its state from Slurm (sacct, else squeue) or from its run directory, its
progress from its metrics.jsonl, and the state of a job chain's steps. Read only: nothing here writes or
submits, so the commands that only read (status, logs) stand on this alone.

State comes from sacct (accounting); when accounting is off or does not know the job, from squeue; when
Slurm knows nothing (a --local run, or a job long gone), from what the run directory says. The `source`
says which. A run whose job ended after the watchdog's `hung` record (tinygpt/training/watchdog.py) is HUNG, at its
step, on the nodes of the ranks that stopped answering.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tinygpt.launch.slurm import slurm_cli
from tinygpt.training import metrics

if TYPE_CHECKING:
    from tinygpt.launch.manifest import Manifest, Submission

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
            "HUNG", "FINISHED", "PREEMPTED", "PRUNED"}
FAILED = ("FAILED", "OUT_OF_MEMORY", "NODE_FAIL", "TIMEOUT", "BOOT_FAIL", "DEADLINE", "HUNG")
# What `launch.py resubmit` takes by default. PREEMPTED is Slurm's own word for a job it ended to make room
# (PreemptMode=CANCEL, or REQUEUE for a job that may not be requeued); a user's or an admin's scancel is
# CANCELLED, which means stop: only --states takes it.
RESUBMIT_DEFAULT = ("FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "HUNG", "PREEMPTED")
RESUBMIT_CHOICES = (*RESUBMIT_DEFAULT, "CANCELLED", "BOOT_FAIL", "DEADLINE")
WAITING = "WAITING for a wave"  # a run of a sweep larger than the queue limits, not submitted yet
SUMMARY_ABOVE = 100  # runs: `status` shows a larger sweep as its runs by state, with those that need a look listed


class RunState(str):
    """A run's state as shown: Slurm's word (`COMPLETED`, `CANCELLED by 1000`) or ours (`FINISHED`, `HUNG at step
    120`, from the run directory). The text compares as it reads; `name` is the word alone."""

    @property
    def name(self) -> str:
        return self.split(" ", 1)[0] if self.strip() else "?"

    @property
    def ended(self) -> bool:
        return self.name in TERMINAL

    @property
    def failed(self) -> bool:
        return self.name in FAILED


@dataclass
class Row:
    index: int
    name: str
    job_id: str
    state: RunState
    source: str
    restarts: int | None
    step: int | None
    max_steps: int | None
    train_loss: float | None
    val_loss: float | None
    tokens_per_s: float | None
    eta_s: float | None
    run_dir: str
    nodes: str = ""  # where its latest life ran
    history: tuple[str, ...] = ()  # its earlier submissions: "JOB STATE on NODES", oldest first
    starts: str = ""  # when Slurm expects its pending job to start, where it says (squeue's estimate)
    round: int | None = None  # under a retry policy: the round of its newest job (the launch is round 1)
    reason: str = ""  # why Slurm keeps its job pending (squeue's reason: Priority, QOSMaxJobsPerUserLimit, ...)

    def __post_init__(self) -> None:
        self.state = RunState(self.state)


# Each metrics file's progress as last read, by the file (its inode, size and time): a process that asks again and
# again (`status --watch`, `serve`'s pages) reads a file only when it changed, not 10,000 files every refresh.
_READ: dict[str, tuple[tuple[int, int, int], dict]] = {}


def read_progress(run_dir: str | Path) -> dict:
    """What metrics.jsonl says: last step, losses, speed, whether the run finished or was paused, and `last`, the
    last point of each named value ({name: (step, value)}, as `metrics.series` names them)."""
    path = os.path.join(run_dir, metrics.FILE_NAME)  # (a str, not a Path: 10,000 of them every refresh)
    try:
        stat = os.stat(path)
    except OSError:
        return {}
    seen = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
    kept = _READ.get(path)
    if kept is None or kept[0] != seen:
        kept = _READ[path] = (seen, _progress(path))
    return dict(kept[1])


def _progress(path: str) -> dict:
    records = metrics.read(path)
    info: dict = {"last": {name: points[-1] for name, points in metrics.series(records).items()}}
    for rec in records:
        event = rec.get("event")
        if event == "start":
            info["started"] = True
            info["restarts_seen"] = rec.get("restarts")
            info.pop("event", None)
        elif event:
            info["event"] = event
            if event == "hung":  # (the watchdog's record: tinygpt/training/watchdog.py)
                info["hung"] = rec
        if "lr" in rec:
            info.update(step=rec["step"], train_loss=rec.get("train_loss"), tokens_per_s=rec.get("tokens_per_s"),
                        elapsed_s=rec.get("elapsed_s"))
        elif not event and isinstance(rec.get("step"), int):  # (a program of the user's: any named values)
            info["step"] = max(info.get("step", 0), rec["step"])
            if rec.get("train_loss") is not None:
                info["train_loss"] = rec["train_loss"]
        if rec.get("val_loss") is not None:
            info["val_loss"] = rec["val_loss"]
            info["step"] = max(info.get("step", 0), rec["step"])
    return info


def state_from_run_dir(progress: dict) -> RunState:
    if progress.get("event") == "finished":
        return RunState("FINISHED")
    if progress.get("event") == "pruned":
        return RunState("PRUNED")
    if progress.get("event") in ("preempted", "paused"):
        return RunState("STOPPED")
    if progress.get("started") or progress.get("step") is not None:  # (a program of the user's: a step it wrote)
        return RunState("STARTED")
    return RunState("NOT_STARTED")


class Rows(list[Row]):
    """A row per run, and who among Slurm's daemons did not answer (`unheard`: slurm_cli's words)."""

    unheard: list[str]


def collect(manifest: Manifest) -> Rows:
    """A row per run of the sweep."""
    ids = manifest.task_job_ids()
    wanted = sorted(set(ids.values()))
    slurm_states, unheard = job_states(wanted, manifest.first_submitted()) if wanted else ({}, [])
    history = submission_history(manifest)
    rounds = retry_rounds(manifest) if manifest.retry else {}
    waiting = set(manifest.waiting())
    rows = Rows()
    rows.unheard = unheard
    for run in manifest.runs:
        run_dir = run.out_dir
        progress = read_progress(run_dir)
        job_id = ids.get(run.index, "")
        js = slurm_states.get(job_id)
        if js is not None and RunState(js.state).ended and js.state != "COMPLETED" and \
                progress.get("event") == "finished":
            # (the run's own record outranks its task's end: a packed task ends FAILED for a run beside it)
            state, source, restart_count = RunState("FINISHED"), js.source, js.restarts
        elif js is not None:
            state, source, restart_count = RunState(js.state), js.source, js.restarts
        elif run.index in waiting:  # (not submitted yet: the heal job sends it in a wave)
            state, source, restart_count = RunState(WAITING), "waves", None
        else:
            state, source = state_from_run_dir(progress), "run dir"
            restart_count = progress.get("restarts_seen")
        nodes = js.nodes if js else ""
        if progress.get("event") == "hung" and state.name not in ("RUNNING", "PENDING", "COMPLETING", "REQUEUED"):
            hung = progress["hung"]  # the ranks that stopped answering, where known, else the one that said so
            listed = hung.get("silent_nodes") if isinstance(hung.get("silent_nodes"), list) else []
            silent = [n for n in listed if isinstance(n, str) and n and " " not in n]
            state, nodes = RunState(f"HUNG at step {hung['step']}"), ",".join(silent)
        step, max_steps = progress.get("step"), run.max_steps
        eta = None
        if step and max_steps and progress.get("elapsed_s") and not state.ended and step < max_steps:
            eta = progress["elapsed_s"] / step * (max_steps - step)
        rows.append(Row(run.index, run.name, job_id or "-", state, source, restart_count, step, max_steps,
                        progress.get("train_loss"), progress.get("val_loss"), progress.get("tokens_per_s"), eta,
                        str(Path(run_dir)), nodes, history.get(run.index, ()), js.starts if js else "",
                        rounds.get(run.index), js.reason if js and js.reason != "None" else ""))
    return rows


def retry_rounds(manifest: Manifest) -> dict[int, int]:
    """Run index -> the retry policy's round of its newest submission (a `resubmit` by hand leaves a run in its
    round; the launch is round 1)."""
    found: dict[int, int] = {}
    for sub in manifest.slurm_submissions():
        for index in sub.indices:
            found[index] = sub.round or found.get(index, 1)
    return found


def job_states(wanted: list[str], since: float | None) -> tuple[dict[str, slurm_cli.JobState], list[str]]:
    """Each job's state as accounting records it, but the controller's where accounting does not know the job
    yet, or still calls it live when the controller has seen it end (accounting hears of an end a moment
    later: a status, or a resubmit, right after a job failed would read it as running). Asked by job (an
    array's id stands for all its tasks): a ping and two calls at most, however many tasks. Also who did not
    answer (slurm_cli's words for the controller, accounting), for the caller to say."""
    silence = slurm_cli.controller_silence()
    away = silence not in (None, slurm_cli.NO_COMMANDS)  # (then squeue would wait out Slurm's timeout for nothing)
    unheard = [silence] if away else []
    accounted = slurm_cli.sacct_states(jobs_of(wanted), since)
    if accounted is None and (accounting := slurm_cli.accounting_silence()):
        unheard.append(accounting)
    accounted = accounted or {}
    unsure = [j for j in wanted if j not in accounted or not RunState(accounted[j].state).ended]
    queued = (slurm_cli.squeue_states(jobs_of(unsure)) or {}) if unsure and not away else {}
    states = dict(accounted)
    for job in unsure:
        if job not in queued:
            continue
        if job not in accounted or RunState(queued[job].state).ended:
            states[job] = queued[job]
        elif queued[job].starts or queued[job].reason:  # (accounting's record, with the controller's estimate of
            # a pending start and its reason)
            states[job] = dataclasses.replace(accounted[job], starts=queued[job].starts, reason=queued[job].reason)
    return states, unheard


def jobs_of(task_ids: list[str]) -> list[str]:
    """The distinct jobs of some array tasks (`123_4` -> `123`) and plain jobs."""
    return sorted({task_id.split("_")[0] for task_id in task_ids})


def submission_history(manifest: Manifest) -> dict[int, tuple[str, ...]]:
    """Run index -> its earlier lives as recorded by `launch.py resubmit` ("JOB STATE on NODES")."""
    history: dict[int, tuple[str, ...]] = {}
    for sub in manifest.submissions:
        for index, before in sorted((sub.previous or {}).items(), key=lambda kv: int(kv[0])):
            where = f" on {before.nodes}" if before.nodes else ""
            history[int(index)] = history.get(int(index), ()) + (f"{before.job_id} {before.state}{where}",)
    return history


def chain_steps(manifest: Manifest) -> str | None:
    """`chain: data 12 COMPLETED -> training 13 -> report 14 PENDING (Dependency)`, or None without a chain (in
    waves, its report goes out after the last wave)."""
    from tinygpt.launch import manifest as manifest_mod  # (not at import: the commands' parser reads this module)

    steps = [s for s in manifest.submissions if s.role in ("data", "report")]
    waves = manifest_mod.load_waves(manifest.dirs)
    later = ["report after the last wave"] if waves and waves.report and all(s.role != "report" for s in steps) else []
    if not steps and not later:
        return None
    ids = [s.job_id for s in steps]
    queued = slurm_cli.squeue_states(ids) if slurm_cli.controller_silence() is None else None
    states = {**(queued or {}), **(slurm_cli.sacct_states(ids) or {})}

    def said(sub: Submission) -> str:
        js = states.get(sub.job_id)
        reason = f" ({js.reason})" if js and js.reason and js.reason != "None" else ""
        return f"{sub.role} {sub.job_id} {js.state if js else '?'}{reason}"

    training = [s.job_id for s in manifest.submissions if s.indices]
    data = [said(s) for s in steps if s.role == "data"][-1:]
    report = [said(s) for s in steps if s.role == "report"][-1:] or later
    return "chain: " + " -> ".join([*data, f"training {', '.join(training[-1:])}", *report])
