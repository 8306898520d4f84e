"""A launch (`launch.py SPEC`, `launch.py check SPEC`, `api.launch`): a spec read and checked (every problem at
once, the local ones before Slurm is asked anything), its manifest and scripts written (plan.py), then submitted
through a backend (or run here with --local, or as a chain of jobs with --chain); nothing is written while a check
fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import io
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field
from rich.table import Table

from tinygpt.base import durable
from tinygpt.launch import manifest as manifest_mod
from tinygpt.launch.act import relaunch
from tinygpt.launch.console import console as output_console
from tinygpt.launch.console import next_command
from tinygpt.launch.errors import LaunchError
from tinygpt.launch.heal import job as heal_job
from tinygpt.launch.heal import waves
from tinygpt.launch.layout import REPO_ROOT
from tinygpt.launch.read import run_states
from tinygpt.launch.slurm import slurm_cli
from tinygpt.launch.spec import corpora
from tinygpt.launch.spec import sweep as spec_mod
from tinygpt.launch.submit import backends, chain, preflight, snapshot
from tinygpt.launch.submit import plan as plan_mod
from tinygpt.launch.submit.slurm_options import unwritable

if TYPE_CHECKING:
    from tinygpt.launch.manifest import Manifest
    from tinygpt.launch.slurm.live_cluster import LiveCluster
    from tinygpt.launch.spec.sweep import Sweep
    from tinygpt.launch.submit.plan import Plan
    from tinygpt.launch.submit.snapshot import Snapshot


MAX_NPROC = 64  # --local's ranks per run: a machine's worth; more only oversubscribes it


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    """What a launch is asked: the options of `launch.py SPEC` by their names there (`check`: a dry run that is
    checked against the live cluster)."""

    spec: str
    workdir: str = "."
    cluster: str | None = None
    backend: str | None = None
    set: Sequence[str] = ()  # KEY=VALUE, each a trainer key (or a command's value) set for every run
    command: Literal["launch", "check"] = "launch"
    dry_run: bool = False
    local: bool = False
    chain: bool = False
    hold: bool = False
    nproc: int = 1
    no_check: bool = False
    no_snapshot: bool = False
    fresh: bool = False


def run(args: LaunchOptions) -> int:
    """`launch.py SPEC` (and `check SPEC`): the spec read and checked, then written and submitted."""
    # A sweep of 100,000 runs is a few hundred thousand small objects, none of them in a reference cycle: the
    # cyclic collector would walk them again and again (a third of such a launch), so it rests until the end.
    gc.disable()
    try:
        return _run(args)
    finally:
        gc.enable()


def _run(args: LaunchOptions) -> int:
    if not 1 <= args.nproc <= MAX_NPROC:
        raise LaunchError(f"--nproc: must be from 1 to {MAX_NPROC}, got {args.nproc}")
    set_values = {}
    for item in args.set:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise LaunchError(f"--set {item!r}: write KEY=VALUE, e.g. --set max_steps=300")
        set_values[key.strip()] = value
    sweep = spec_mod.load(args.spec, args.workdir, cluster=args.cluster, backend=args.backend,
                         set_values=set_values)
    backend = backends.chosen(sweep, args.local, args.nproc)
    _refuse_local_problems(sweep, args, backend)
    for warning in backend.warnings():
        print(f"warning: {warning}", file=sys.stderr)
    cluster = None  # (the live cluster, asked when the spec is checked against it)
    if args.command == "check" or (backend.to_slurm and not (args.dry_run or args.no_check)):
        cluster = preflight.before_writing(sweep)  # (nothing is written when it fails)
    elif backend.to_slurm and args.no_check and not args.dry_run:
        slurm_cli.require_controller()
        print("not checked against the live cluster (--no-check)")
    # One command at a time writes a sweep: from the check that its jobs are not live to the last record.
    with manifest_mod.sweep_lock(sweep.dirs.jobs):
        return _launch_locked(sweep, args, backend, cluster)


class CheckDocument(BaseModel):
    """The document `check --json` prints."""

    model_config = ConfigDict(extra="forbid")

    format: Literal[1] = Field(description="this document's format")
    spec: str = Field(description="the spec checked")
    ok: bool = Field(description="whether the spec fits the live cluster (exit status 0)")
    exit_status: int = Field(description="the status `check` ends with: 0, 1 (a problem) or 75 (Slurm away: retry)")
    problems: list[str] = Field(description="what is wrong, one entry a line of the message (empty when ok)")
    said: list[str] = Field(description="what `check` printed: the runs, the resources, Slurm's estimates")


def check_document(options: LaunchOptions) -> CheckDocument:
    """`check` run with its words caught (a refusal among them, as its message and exit status): the outcome as one
    document (`check --json`, `api.check`)."""
    said, problems = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(problems):
        try:
            status = run(dataclasses.replace(options, command="check", dry_run=True, local=False, hold=False))
        except LaunchError as err:
            print(f"error: {err}", file=sys.stderr)
            status = err.exit_status
    lines = [line.removeprefix("error: ") for line in problems.getvalue().splitlines() if line.strip()]
    return CheckDocument(format=1, spec=str(options.spec), ok=status == 0, exit_status=status,
                         problems=lines if status else [], said=said.getvalue().splitlines())


def _refuse_local_problems(sweep: Sweep, args: LaunchOptions, backend: backends.Backend) -> None:
    """Everything this machine can check beyond the spec's schema, before Slurm is asked anything: the values the
    #SBATCH lines will carry (as sbatch will read them) and the options, all at once; then, for a submission or
    a check with none of those, each corpus prepared where the jobs will read it (its file decodes, data_dir
    takes the prepared data; written only for a spec fit to go). The same message on every machine."""
    problems = unwritable(sweep) + backend.refusals(sweep, hold=args.hold, chain=args.chain, dry_run=args.dry_run,
                                                    nproc=args.nproc)
    if sweep.retry is not None and args.chain and backend.to_slurm:
        problems.append("--chain: the report step would run before the retry policy's rounds end; launch without "
                        "--chain (the heal job writes runs/<sweep>/summary.md at the end), or without `retry`")
    if sweep.command is not None:
        if backend.to_slurm and not args.no_snapshot:  # (what the jobs' snapshot of the project will hold)
            problems += snapshot.unheld_words(sweep.project, sweep.command.argv, tuple(sweep.command.include))
    elif not problems and (args.command == "check" or (backend.to_slurm and not (args.dry_run or args.chain))):
        problems = corpora.prepare_data(sweep)[1]  # (read by every task: a corpus that fails stops us here)
    if problems:
        raise LaunchError(problems, str(args.spec))


def _launch_locked(sweep: Sweep, args: LaunchOptions, backend: backends.Backend, cluster: LiveCluster | None) -> int:
    before = _launched_before(sweep, args, backend)
    if before is None:
        return 0
    again, launch_number = before
    plan = plan_mod.build(sweep, _snapshot(sweep, args.no_snapshot) if backend.to_slurm else None,
                          _project(sweep, args.no_snapshot) if sweep.command is not None and backend.to_slurm
                          else None, again.merged() if again else None, launch_number)
    steps = {}
    in_waves = waves.at_launch(plan, cluster, again is not None, args.dry_run, args.chain) if (
        cluster is not None and backend.name == "sbatch") else None
    if backend.to_slurm:
        _say_steering_variables()
        steps = chain.write_scripts(plan) if args.chain else {}
        if sweep.retry is not None or in_waves:
            heal_job.write_scripts(plan)
    _print_plan(plan, backend, steps)
    if in_waves:
        print(waves.said(in_waves.record, in_waves.tasks, in_waves.places, in_waves.tightest))
    if cluster is not None:
        for estimate in preflight.before_submitting(plan, cluster, in_waves is not None):
            print(f"slurm: {estimate}")
    if args.dry_run:
        print(f"check: the spec fits cluster {cluster.name} (Slurm {cluster.release}); nothing submitted"
              if args.command == "check"
              else "dry run: nothing submitted")
        return 0
    return _send(plan, args, backend, steps, again, in_waves)


def _launched_before(sweep: Sweep, args: LaunchOptions,
                     backend: backends.Backend) -> tuple[relaunch.Relaunch | None, int] | None:
    """A sweep launched before: what a relaunch submits and its launch's number ((None, 1): a first launch, or
    one that starts over); None when nothing is to be submitted."""
    if not sweep.dirs.manifest.exists():
        return None, 1
    previous = manifest_mod.load(sweep.dirs.manifest)  # (its jobs and its study come first)
    if not _relaunches(previous, sweep, args.chain, backend):
        _refuse_if_live(previous, sweep.name, args.spec)
        _refuse_changed_search(previous, sweep)
        return None, 1
    again = _again(previous, sweep, args)
    if again is None:
        return None
    return again, 1 + len({s.script for s in previous.submissions if s.script and s.indices})


def _send(plan: Plan, args: LaunchOptions, backend: backends.Backend, steps: dict, again: relaunch.Relaunch | None,
          in_waves: waves.Waves | None) -> int:
    """The written plan submitted: as a chain, in waves, or whole (with a retry policy's heal job)."""
    if args.chain and not backend.to_slurm:
        return _chain_here(plan, backend, args.spec)
    if steps and not in_waves:
        ids = chain.submit(plan, steps, lambda dependency: backend.submit(plan, False, dependency), args.hold)
        data = f"data job {ids['data'][0]}, " if "data" in ids else ""
        print(f"submitted the chain: {data}training array {', '.join(ids['training'])}, report job "
              f"{ids['report'][0]}; follow with `{next_command('status', args.spec)}`")
        return 0
    _set_aside_the_last_launchs(plan, again is not None)
    if in_waves:
        return waves.launch_first(plan, in_waves, next_command("status", args.spec), steps, args.hold)
    ids = backend.submit(plan, args.hold, None)
    if not backend.to_slurm:
        print(f"see `{next_command('status', args.spec)}`"
              + ("; its retry policy is Slurm's: here each run ran once" if plan.sweep.retry else ""))
        return 0
    print(f"submitted {len(again.submit) if again else len(plan.sweep.runs)} run(s) as job array {', '.join(ids)}; "
          f"follow with `{next_command('status', args.spec)}`")
    _supervise(plan, ids)
    return 0


def _set_aside_the_last_launchs(plan: Plan, relaunch: bool) -> None:
    """An earlier launch's summary and cancellation (and its waves, unless this launch adds to them)."""
    dirs = plan.sweep.dirs
    for done in (dirs.summary, dirs.cancelled, *(() if relaunch else (dirs.waves,))):
        if done.exists():
            durable.set_aside(done)


def _supervise(plan: Plan, ids: list[str]) -> None:
    """A sweep with a retry policy: its heal job after the first round."""
    if plan.sweep.retry is None:
        return
    job = heal_job.submit(manifest_mod.load(plan.manifest_path), heal_job.after_all(ids), 1)
    rounds = plan.sweep.retry.rounds
    print(f"retry: heal job {job} follows the runs (afterany): it sends again what ended by "
          f"{', '.join(plan.sweep.retry.ends)}, for at most {rounds} more round(s)")


def _again(previous: Manifest, sweep: Sweep, args: LaunchOptions) -> relaunch.Relaunch | None:
    """A relaunch shown: what to submit, the changed runs' directories moved aside for --fresh; None when nothing
    is to be submitted (nothing new, or a dry run or check, which write nothing)."""
    again = relaunch.compare(previous, sweep, args.fresh, _code_digest(sweep, args) if sweep.code_counts else None)
    relaunch.show(again)
    if not again.submit:
        print("nothing new to submit: every run of the spec is finished, live or failed (`resubmit` sends failed "
              "ones again)")
        return None
    if args.dry_run or args.command == "check":
        print(f"{'check' if args.command == 'check' else 'dry run'}: would submit {len(again.submit)} run(s); "
              f"nothing written")
        return None
    for old, aside in again.aside:
        if old.exists():
            old.rename(aside)
    return again


def _code_digest(sweep: Sweep, args: LaunchOptions) -> str | None:
    """The digest of the code the sweep's runs would be submitted with, read and not written: the project's for a
    command, the launcher's for the trainer (a tree sent from a laptop is its own snapshot); None: --no-snapshot."""
    if args.no_snapshot:
        return None
    if sweep.command is None:
        received = snapshot.received(REPO_ROOT)
        return received.digest if received else snapshot.read(REPO_ROOT).digest
    received = snapshot.received(sweep.project)
    return received.digest if received else snapshot.read(
        sweep.project, everything=True, include=tuple(sweep.command.include)).identity(sweep.project, sweep.spec_path)


def _relaunches(previous: Manifest, sweep: Sweep, chained: bool, backend: backends.Backend) -> bool:
    """Whether launching the spec again submits only its new runs (relaunch.py): a job array of runs of its own,
    submitted to Slurm before; an Optuna search's workers, submitit's array, a chain, --local runs and a sweep
    only ever written by a dry run start over as before."""
    chained = chained or any(s.role in chain.ROLES for s in previous.submissions)
    return (backend.to_slurm and not chained and sweep.backend == previous.backend == "sbatch" and sweep.search is None
            and previous.search is None and bool(previous.slurm_submissions()))


def _say_steering_variables() -> None:
    """sbatch reads SBATCH_* variables of the submitting shell over a script's #SBATCH lines (`man sbatch`, INPUT
    ENVIRONMENT VARIABLES): said, so that a job asking for what the spec did not is no surprise."""
    if steering := sorted(name for name in os.environ if name.startswith("SBATCH_")):
        shown = ", ".join(f"{name}={os.environ[name]!r}"[:120] for name in steering)
        print(f"note: sbatch reads {shown} from this shell, over the scripts' #SBATCH lines; unset them to submit "
              f"exactly what the spec asks for")


def _chain_here(plan: Plan, backend: backends.Backend, spec: str) -> int:
    """--local --chain: the data first, then every run, then the report (after the runs, whatever they did)."""
    if plan.sweep.command is None:
        prepared, problems = corpora.prepare_data(plan.sweep)
        if problems:
            raise LaunchError(problems, spec)
        print(f"=== chain, data: prepared {', '.join(prepared)}")
    try:
        backend.submit(plan)
    finally:
        print("=== chain, report:")
        from tinygpt.launch.read import sweep_report

        reported = sweep_report.make(manifest_mod.load(plan.manifest_path), None)
    print(f"see `{next_command('status', spec)}`")
    return reported


def _snapshot(sweep: Sweep, live: bool) -> Snapshot | None:
    """The code snapshot the sweep's jobs will import (None with --no-snapshot), said in one line."""
    if live:
        print(f"code: the live checkout {REPO_ROOT} (--no-snapshot): each job runs what it holds when "
              f"the job starts")
        return None
    start = time.perf_counter()
    limit = sweep.snapshot_max_file_mb
    snap = snapshot.take(REPO_ROOT, sweep.dirs.code, None if limit is None else int(limit * 1e6))
    version = f" of {snap.commit[:10]}" if snap.commit else " (not a git checkout: the package files)"
    print(f"code: snapshot {snap.digest}{version}{' with uncommitted changes' if snap.dirty else ''}, "
          f"{snap.files} files, {snap.bytes / 1e6:.2f} MB, {'reused' if snap.reused else 'taken'} in "
          f"{time.perf_counter() - start:.2f} s")
    if snap.untracked:
        print(f"warning: not in the snapshot, as git does not track them: {', '.join(snap.untracked)}; `git add` "
              f"them if the jobs need them", file=sys.stderr)
    return snap


def _project(sweep: Sweep, live: bool) -> Snapshot | None:
    """The snapshot of the user's project that a command's runs start in (None with --no-snapshot), said."""
    if live:
        print(f"project: the live folder {sweep.project} (--no-snapshot)")
        return None
    limit = sweep.snapshot_max_file_mb
    snap = snapshot.take(sweep.project, sweep.dirs.jobs / "project", None if limit is None else int(limit * 1e6),
                         everything=True, include=tuple(sweep.command.include), spec=sweep.spec_path)
    what = f"git {snap.commit[:10]}{' with uncommitted changes' if snap.dirty else ''}" if snap.commit \
        else "not a git work tree: every file"
    print(f"project: snapshot {snap.digest} of {sweep.project} ({what}), {snap.files} files, {snap.bytes / 1e6:.2f} "
          f"MB, {'reused' if snap.reused else 'taken'}")
    if snap.left_out:
        said = ", ".join(f"{e.path} ({e.files} file{'s' if e.files > 1 else ''}, {e.bytes / 1e6:.2f} MB)"
                         for e in snap.left_out)
        print(f"project: left out, as git does not track them: {said}; a run "
              f"that reads one needs it in command.include (a glob), or by its absolute path (it stays where it is)")
    return snap


def _refuse_if_live(manifest: Manifest, name: str, spec: str) -> None:
    """A sweep whose jobs are pending or running reads its files when each task starts: launching it again
    (even a dry run, which rewrites its configs and scripts) would change what those jobs train. The queue
    decides; when Slurm cannot say, nothing is written either (the guard fails closed)."""
    jobs = {job: manifest.runs[index].name for index, job in manifest.task_job_ids().items()}
    jobs |= {s.job_id: f"the chain's {s.role} step" if s.role in chain.ROLES else f"its retry policy's {s.role} job"
             for s in manifest.submissions if s.role}
    if not jobs:
        return
    queued = relaunch.queued(list(jobs), name)
    live = [f"{what} (job {job}, {queued[job].state})" for job, what in jobs.items()
            if job in queued and queued[job].state not in run_states.TERMINAL]
    if live:
        raise LaunchError(f"sweep `{name}` has jobs that are still live: {', '.join(live)}. They read this "
                          f"sweep's files when they start, so nothing was written; wait for them to end, cancel "
                          f"them ({next_command('cancel', spec)}), or launch the spec under another `name`")


def _refuse_changed_search(manifest: Manifest, sweep: Sweep) -> None:
    """An Optuna study's trials were drawn from its space: a relaunch with other `search.params` would leave
    them unreadable to the sampler (and a trial left running could never resume), so it is refused."""
    before = manifest.search
    after = (sweep.search or {}).get("dists")
    if before is not None and Path(before.journal).exists() and before.dists != after:
        raise LaunchError(f"search.params: not those of the Optuna study sweep `{sweep.name}` has begun "
                          f"({before.journal}); a study keeps its space. Give the spec a new `name` to start "
                          f"another study, or put search.params back as they were: {before.dists}")


def _print_words(plan: Plan, index: int, console) -> None:
    """The words run `index` starts with, as its task will (from the manifest): in a first life, and in a life
    that resumes."""
    head, run = manifest_mod.load_run(plan.manifest_path, index)
    values = {**head.base, **run.own, "run_dir": run.out_dir, "run_name": run.name, "sweep": head.name}
    console.print(f"run {run.name}, first life: {shlex.join(head.command.words(values))}", markup=False,
                  highlight=False, soft_wrap=True)
    if (found := head.command.resume_pattern(values)) is not None:
        console.print(f"run {run.name}, a life that finds {found}: "
                      f"{shlex.join(head.command.words(values, str(found)))}",
                      markup=False, highlight=False, soft_wrap=True)


def _print_plan(plan: Plan, backend: backends.Backend, steps: dict) -> None:
    sweep = plan.sweep
    console = output_console()
    # A line of its own, not the table's title: rich wraps a title at the table's width.
    console.print(f"{sweep.name}: {len(sweep.runs)} run(s), backend {backend.name}, "
                  f"cluster {sweep.profile.name}", markup=False, highlight=False, style="italic")
    t = Table() if console.is_terminal else Table(box=None)  # piped: plain columns, no box drawing
    t.add_column("#", justify="right")
    t.add_column("run")
    t.add_column("settings")
    shown = sweep.runs if len(sweep.runs) <= 40 else sweep.runs[:20] + sweep.runs[-5:]
    for run in shown:
        settings = ", ".join(f"{k}={v}" for k, v in run.point.items()) or "(base config)"
        t.add_row(str(run.index), run.name, settings)
    console.print(t)
    if len(shown) < len(sweep.runs):
        console.print(f"... {len(sweep.runs) - len(shown)} more runs not shown")
    console.print(f"resources per run: {sweep.resources.describe()}"
                  + (f"; at most {sweep.array_parallelism} at once" if sweep.array_parallelism else ""))
    if sweep.command is not None and sweep.runs and sweep.search is None:  # (a search's trials draw their values)
        _print_words(plan, sweep.runs[0].index, console)
    if sweep.command is not None and not sweep.resources.gpus_per_node and sweep.profile.node.gpus:
        console.print(f"  (a program of yours gets one task and no GPU unless `resources` asks: gpus_per_node: N, "
                      f"tasks_per_node: N; a node of `{sweep.profile.name}` has {sweep.profile.node.gpus})",
                      markup=False)
    for path, array, _, _ in plan.scripts:
        console.print(f"script: {path} (array {array})")
    for step, path in steps.items():
        console.print(f"chain, {step} step: {path}")
    console.print(f"manifest: {plan.manifest_path}")
