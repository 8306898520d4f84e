"""`python launch.py`: YAML jobs and sweeps to Slurm (sbatch job arrays or submitit), or to this machine.

    python launch.py SPEC.yaml                  validate, write scripts and manifest, submit
    python launch.py SPEC.yaml --dry-run        the same without submitting: a table of runs and resources
    python launch.py check SPEC.yaml            the spec against the live cluster, then sbatch --test-only
    python launch.py SPEC.yaml --local          run every run here on CPU, one after another
    python launch.py SPEC.yaml --chain          data job -> training array (afterok) -> report job (afterany)
    python launch.py status SPEC.yaml [--watch] a table of the sweep's runs
    python launch.py cancel SPEC.yaml           scancel the sweep's jobs
    python launch.py resubmit SPEC.yaml         the runs that failed, hung or were preempted, again
                     [--time T] [--mem M] [--exclude NODES] [--exclude-failed-nodes] [--states S,...] [--dry-run]
    python launch.py report SPEC.yaml           loss curves, final losses, samples, attention maps
    python launch.py logs SPEC.yaml [RUN]       a run's Slurm log, its latest life [--tail N] [--follow] [--all]
    python launch.py sync SPEC.yaml             upload the sweep's offline W&B runs (wandb sync), from a login node
    python launch.py schema [spec|profile]      the JSON Schema of a spec or a cluster profile [--write: schemas/]
    python launch.py profile new                a cluster profile from what Slurm says [--name N] [--force]

`launch.py COMMAND --help` lists a command's options (`launch.py launch --help`: those of `launch.py SPEC`).
Errors in the spec are all reported at once, and nothing is submitted; the exit status is 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import LaunchError

if TYPE_CHECKING:
    from .manifest import Manifest


def parser() -> argparse.ArgumentParser:
    """`launch.py COMMAND ...`, a sub-command each; `launch.py SPEC` is `launch.py launch SPEC`. Built from
    argparse and the run states' names alone (no pydantic), so that `launch.py --help` imports nothing heavy."""
    top = argparse.ArgumentParser(prog="launch.py", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = top.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, help: str, spec_help: str = "the spec that was launched (or its "
                "jobs/<sweep>/manifest.json)") -> argparse.ArgumentParser:
        p = commands.add_parser(name, help=help, description=help)
        p.add_argument("spec", help=spec_help)
        p.add_argument("--workdir", default=".", help="where jobs/, logs/ and runs/ go (default: here)")
        return p

    _launch_options(command("launch", "validate, write scripts and manifest, submit (the default command)",
                            "a job or sweep YAML (see jobs/)"))
    _launch_options(command("check", "the spec against the live cluster (partition, time, GPUs, account, QOS, "
                                     "array size), then sbatch --test-only: when it would start; nothing submitted",
                            "a job or sweep YAML (see jobs/)"), submits=False)
    p = command("status", "a table of the sweep's runs")
    p.add_argument("--watch", action="store_true", help="refresh until every run has ended")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between refreshes")
    p.add_argument("--efficiency", action="store_true",
                   help="how each run used its allocation: CPU and memory efficiency, GPU use (sacct)")
    command("cancel", "scancel the sweep's jobs")
    _resubmit_options(command("resubmit", "the runs that failed, hung or were preempted, again"))
    p = command("report", "loss curves, final losses, samples, attention maps")
    p.add_argument("--prompt", default=None, help="prompt for the attention maps and samples")
    p = command("logs", "a run's Slurm log, its latest life")
    p.add_argument("run", nargs="?", help="a run's name or number (default: every run)")
    p.add_argument("--tail", type=int, metavar="N", help="only the last N lines of each log")
    p.add_argument("--follow", action="store_true", help="keep printing the run's log as it grows")
    p.add_argument("--all", action="store_true", help="every job of the run, every life, not only the latest")
    p = command("sync", "upload the sweep's offline W&B runs (wandb sync), from a login node")
    p.add_argument("--dry-run", action="store_true", help="show what W&B would upload, upload nothing")
    p = commands.add_parser("profile", help="a cluster profile written from what the reachable Slurm says",
                            description="`profile new`: ask the reachable Slurm (scontrol, sacctmgr) and write "
                                        "hpc_lab/clusters/<ClusterName>.yaml, a comment on every guess.")
    p.add_argument("action", choices=("new",))
    p.add_argument("--name", help="the profile's name (default: Slurm's ClusterName)")
    p.add_argument("--force", action="store_true", help="write over a profile of that name")
    p.add_argument("--dir", help="the folder to write it in (default: hpc_lab/clusters, where --cluster looks)")
    p = commands.add_parser("schema", help="the JSON Schema of a spec or a cluster profile",
                            description="The JSON Schema that specs (jobs/*.yaml) or cluster profiles "
                                        "(hpc_lab/clusters/*.yaml) are checked with, for editors.")
    p.add_argument("kind", nargs="?", choices=("spec", "profile"), default="spec", help="default: spec")
    p.add_argument("--write", action="store_true", help="write both into schemas/ (what a test compares)")
    return top


def _launch_options(p: argparse.ArgumentParser, submits: bool = True) -> None:
    """The options of `launch.py SPEC`; `check`, which submits nothing, has those that shape the plan alone."""
    p.add_argument("--cluster", help="profile name in hpc_lab/clusters/, a profile path, or auto "
                                     "(overrides the spec's `cluster`)")
    p.add_argument("--backend", help="sbatch or submitit (overrides the spec's `backend`)")
    p.add_argument("--chain", action="store_true",
                   help="three jobs: data preparation, the training array after it, the sweep report after that")
    p.add_argument("--no-snapshot", action="store_true",
                   help="jobs import the live checkout when they start, not a snapshot of the code as it is now")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="set a trainer key for every run, e.g. --set max_steps=300 (repeatable)")
    if not submits:
        p.set_defaults(dry_run=True, local=False, hold=False, nproc=1, no_check=False)
        return
    p.add_argument("--dry-run", action="store_true", help="write scripts and manifest, submit nothing")
    p.add_argument("--local", action="store_true", help="run here on CPU instead of submitting")
    p.add_argument("--hold", action="store_true",
                   help="submit held (sbatch --hold); start them with `scontrol release JOBID`")
    p.add_argument("--nproc", type=int, default=1, help="with --local: gloo ranks per run (default 1)")
    p.add_argument("--no-check", action="store_true",
                   help="submit without checking the spec against the live cluster first (see `launch.py check`)")


def _resubmit_options(p: argparse.ArgumentParser) -> None:
    from .states import RESUBMIT_DEFAULT

    p.add_argument("--states", default=",".join(RESUBMIT_DEFAULT),
                   help="resubmit the runs whose latest job ended in one of these (default: %(default)s)")
    p.add_argument("--time", help="a new time limit, e.g. 04:00:00")
    p.add_argument("--mem", help="a new memory request, e.g. 16G")
    p.add_argument("--exclude", action="append", default=[], metavar="NODES",
                   help="nodes not to run on, e.g. node3 or node[3-4] (repeatable)")
    p.add_argument("--exclude-failed-nodes", action="store_true",
                   help="also exclude the nodes on which a run of this sweep ended in NODE_FAIL or HUNG")
    p.add_argument("--dry-run", action="store_true", help="say what would be resubmitted, submit nothing")


def _status(args: argparse.Namespace) -> int:
    manifest = _launched(args)
    if args.efficiency:
        from . import efficiency

        efficiency.show(manifest)
        return 0
    from . import status

    status.show(manifest, watch=args.watch, interval=args.interval)
    return 0


def _schema(args: argparse.Namespace) -> int:
    from tinygpt import durable

    from . import json_schema

    if not args.write:
        print(json_schema.text(args.kind), end="")
        return 0
    for kind in json_schema.KINDS:
        json_schema.path(kind).parent.mkdir(exist_ok=True)
        durable.write(json_schema.path(kind), json_schema.text(kind))
        print(f"wrote {json_schema.path(kind)}")
    return 0


def _profile(args: argparse.Namespace) -> int:
    from . import profile_new
    from .profiles import PROFILE_DIR

    path = profile_new.write(Path(args.dir) if args.dir else PROFILE_DIR, args.name, args.force)
    print(f"wrote {path}: read it through; the values marked as guesses, and what Slurm could not say, are "
          f"commented at their lines. Launch with `--cluster {path.stem}` (or `--cluster auto`)")
    return 0


def _manifest_path(spec: str, workdir: str) -> Path:
    """The manifest of the sweep that SPEC launched; SPEC may also be that manifest itself."""
    from .manifest import SweepDirs
    from .spec import load_name

    if Path(spec).name == "manifest.json":
        return Path(spec).resolve()
    if "\x00" in workdir:
        raise LaunchError(f"--workdir: {workdir!r} holds a NUL character; give a directory path")
    return SweepDirs(Path(workdir).resolve(), load_name(spec)).manifest


def _launched(args: argparse.Namespace) -> Manifest:
    """The sweep that the command's SPEC launched, loaded once for the command."""
    from . import manifest

    return manifest.load(_manifest_path(args.spec, args.workdir))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] not in HANDLERS and argv[0] not in ("-h", "--help"):
        argv = ["launch", *argv]  # (`launch.py SPEC`)
    args = parser().parse_args(argv)
    try:
        return HANDLERS[args.command](args)
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # the filesystem refused (full, read-only, permissions): nothing half-written
        from tinygpt.errors import filesystem_message

        print(f"error: {filesystem_message(err)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _launch(args) -> int:
    from . import spec as spec_mod

    if args.nproc < 1:
        raise LaunchError(f"--nproc: must be >= 1, got {args.nproc}")
    if args.local and args.dry_run:
        raise LaunchError("--local and --dry-run: choose one")
    overrides = {}
    for item in args.set:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise LaunchError(f"--set {item!r}: write KEY=VALUE, e.g. --set max_steps=300")
        overrides[key.strip()] = value
    sweep = spec_mod.load(args.spec, args.workdir, cluster=args.cluster, backend=args.backend, overrides=overrides)
    _refuse_local_problems(sweep, args)
    cluster = None  # (the live cluster, asked when the spec is checked against it)
    if args.command == "check" or not (args.dry_run or args.local or args.no_check):
        from . import live_check

        cluster = live_check.before_writing(sweep)  # (nothing is written when it fails)
    elif args.no_check and not (args.dry_run or args.local):
        print("not checked against the live cluster (--no-check)")
    from . import manifest as manifest_mod

    # One command at a time writes a sweep: from the check that its jobs are not live to the last record.
    with manifest_mod.sweep_lock(sweep.dirs.jobs):
        return _launch_locked(sweep, args, cluster)


def _refuse_local_problems(sweep, args) -> None:
    """Everything this machine can check beyond the spec's schema, before Slurm is asked anything: the values the
    #SBATCH lines will carry (as sbatch will read them) and the options, all at once; then, for a submission or
    a check with none of those, each corpus prepared where the jobs will read it (its file decodes, data_dir
    takes the prepared data; written only for a spec fit to go). The same message on every machine."""
    from . import plan as plan_mod
    from .slurm_options import unwritable

    problems = unwritable(sweep)
    if args.hold and (args.local or (sweep.backend != "sbatch" and not args.chain)):
        problems.append("--hold: only for submissions with the sbatch backend (or the data step of --chain)")
    if not problems and (args.command == "check" or not (args.dry_run or args.local or args.chain)):
        problems = plan_mod.prepare_data(sweep)[1]  # (read by every task: a corpus that fails stops us here)
    if problems:
        raise LaunchError(problems, str(args.spec))


def _launch_locked(sweep, args, cluster) -> int:
    from . import plan as plan_mod

    manifest_path = sweep.dirs.manifest
    if manifest_path.exists():  # launched before: its jobs and its study come first
        from . import manifest as manifest_mod

        previous = manifest_mod.load(manifest_path)
        _refuse_if_live(previous, sweep.name, args.spec)
        _refuse_changed_search(previous, sweep)
    plan = plan_mod.build(sweep, None if args.local else _snapshot(sweep, args.no_snapshot))
    steps = {}
    if args.chain and not args.local:
        from . import chain

        steps = chain.write_scripts(plan)
    _print_plan(plan, args, steps)
    if cluster is not None:
        from . import live_check

        for estimate in live_check.before_submitting(plan, cluster):
            print(f"slurm: {estimate}")
    if args.dry_run:
        print(f"check: the spec fits cluster {cluster.name}; nothing submitted" if args.command == "check"
              else "dry run: nothing submitted")
        return 0
    from . import backends

    backend = backends.Local(args.nproc) if args.local else backends.of(sweep.backend)
    if args.local and args.chain:
        return _chain_here(plan, backend, args.spec)
    if steps:
        ids = chain.submit(plan, steps, lambda dependency: backend.submit(plan, False, dependency), args.hold)
        print(f"submitted the chain: data job {ids[0]}, training array {', '.join(ids[1:-1])}, report job {ids[-1]}; "
              f"follow with `python launch.py status {args.spec}`")
        return 0
    ids = backend.submit(plan, args.hold, None)
    if args.local:
        print(f"see `python launch.py status {args.spec}`")
    else:
        print(f"submitted {len(sweep.runs)} run(s) as job array {', '.join(ids)}; follow with "
              f"`python launch.py status {args.spec}`")
    return 0


def _chain_here(plan, backend, spec: str) -> int:
    """--local --chain: the data first, then every run, then the report (after the runs, whatever they did)."""
    from . import manifest as manifest_mod
    from . import plan as plan_mod

    prepared, problems = plan_mod.prepare_data(plan.sweep)
    if problems:
        raise LaunchError(problems, spec)
    print(f"=== chain, data: prepared {', '.join(prepared)}")
    try:
        backend.submit(plan)
    finally:
        print("=== chain, report:")
        reported = _report_manifest(manifest_mod.load(plan.manifest_path), None)
    print(f"see `python launch.py status {spec}`")
    return reported


def _snapshot(sweep, live: bool):
    """The code snapshot the sweep's jobs will import (None with --no-snapshot), said in one line."""
    import time

    from . import plan as plan_mod
    from . import snapshot

    if live:
        print(f"code: the live checkout {plan_mod.REPO_ROOT} (--no-snapshot): each job runs what it holds when "
              f"the job starts")
        return None
    start = time.perf_counter()
    snap = snapshot.take(plan_mod.REPO_ROOT, sweep.dirs.jobs / "code",
                         int(sweep.snapshot_max_file_mb * 1e6))
    version = f" of {snap.commit[:10]}" if snap.commit else " (not a git checkout: the package files)"
    print(f"code: snapshot {snap.digest}{version}{' with uncommitted changes' if snap.dirty else ''}, "
          f"{snap.files} files, {snap.bytes / 1e6:.2f} MB, {'reused' if snap.reused else 'taken'} in "
          f"{time.perf_counter() - start:.2f} s")
    if snap.untracked:
        print(f"warning: not in the snapshot, as git does not track them: {', '.join(snap.untracked)}; `git add` "
              f"them if the jobs need them", file=sys.stderr)
    return snap


def _refuse_if_live(manifest: Manifest, name: str, spec: str) -> None:
    """A sweep whose jobs are pending or running reads its files when each task starts: launching it again
    (even a dry run, which rewrites its configs and scripts) would change what those jobs train. The queue
    decides; when Slurm cannot say, nothing is written either (the guard fails closed)."""
    from . import slurm_cli, states

    jobs = {job: manifest.runs[index].name for index, job in manifest.task_job_ids().items()}
    jobs |= {s.job_id: f"the chain's {s.role} step" for s in manifest.submissions if s.role}
    if not jobs:
        return
    queued = slurm_cli.squeue_states(states.jobs_of(list(jobs)))
    if queued is None:
        raise LaunchError(f"sweep `{name}` has jobs on Slurm, and squeue could not say whether they are still "
                          f"live (it is not on PATH, or it failed); they read this sweep's files when they start, "
                          f"so nothing was written; try again when `squeue` answers, or launch the spec under "
                          f"another `name`")
    live = [f"{what} (job {job}, {queued[job].state})" for job, what in jobs.items()
            if job in queued and queued[job].state not in states.TERMINAL]
    if live:
        raise LaunchError(f"sweep `{name}` has jobs that are still live: {', '.join(live)}. They read this "
                          f"sweep's files when they start, so nothing was written; wait for them to end, cancel "
                          f"them (python launch.py cancel {spec}), or launch the spec under another `name`")


def _refuse_changed_search(manifest: Manifest, sweep) -> None:
    """An Optuna study's trials were drawn from its space: a relaunch with other `search.params` would leave
    them unreadable to the sampler (and a trial left running could never resume), so it is refused."""
    before = manifest.search
    after = (sweep.search or {}).get("dists")
    if before is not None and Path(before.journal).exists() and before.dists != after:
        raise LaunchError(f"search.params: not those of the Optuna study sweep `{sweep.name}` has begun "
                          f"({before.journal}); a study keeps its space. Give the spec a new `name` to start "
                          f"another study, or put search.params back as they were: {before.dists}")


def _print_plan(plan, args, steps: dict) -> None:
    from rich.table import Table

    from .console import console as output_console

    sweep = plan.sweep
    console = output_console()
    # A line of its own, not the table's title: rich wraps a title at the table's width.
    console.print(f"{sweep.name}: {len(sweep.runs)} run(s), backend {'local' if args.local else sweep.backend}, "
                  f"cluster {sweep.profile.name}", markup=False, highlight=False, style="italic")
    t = Table() if console.is_terminal else Table(box=None)  # piped: plain columns, no box drawing
    t.add_column("#", justify="right")
    t.add_column("run")
    t.add_column("settings")
    shown = sweep.runs if len(sweep.runs) <= 40 else sweep.runs[:20] + sweep.runs[-5:]
    for run in shown:
        settings = ", ".join(f"{k}={v}" for k, v in run.overrides.items()) or "(base config)"
        t.add_row(str(run.index), run.name, settings)
    console.print(t)
    if len(shown) < len(sweep.runs):
        console.print(f"... {len(sweep.runs) - len(shown)} more runs not shown")
    console.print(f"resources per run: {sweep.resources.describe()}"
                  + (f"; at most {sweep.array_parallelism} at once" if sweep.array_parallelism else ""))
    for path, array, _, _ in plan.scripts:
        console.print(f"script: {path} (array {array})")
    for step, path in steps.items():
        console.print(f"chain, {step} step: {path}")
    console.print(f"manifest: {plan.manifest_path}")


def _report(args) -> int:
    """`launch.py report SPEC`: runs/<sweep>/report.md over every run of the sweep's manifest."""
    return _report_manifest(_launched(args), args.prompt)


def _report_manifest(manifest: Manifest, prompt: str | None) -> int:
    """The sweep report of a manifest's runs (also the report step of a job chain, on a node)."""
    from tinygpt import report

    out_dir = manifest.dirs.runs
    runs = [(Path(r.out_dir), r.name) for r in manifest.runs]
    varying = sorted({k for r in manifest.runs for k in r.overrides})
    sections = [_efficiency_section(manifest)]
    if manifest.search:  # an Optuna search: its trials are the runs
        from . import search

        trials = search.trials(manifest)
        runs = [(Path(t["run dir"]), f"trial={t['trial']}") for t in trials if t["run dir"]]
        varying = sorted(manifest.search.dists)
        out_dir.mkdir(parents=True, exist_ok=True)
        sections.insert(0, search.report_section(trials, out_dir))
    return report.report_command(runs, out_dir, f"sweep {manifest.name}", varying, prompt,
                                 "\n".join(s for s in sections if s) or None)


def _efficiency_section(manifest: Manifest) -> str | None:
    """The report's efficiency table, when the sweep ran on Slurm and accounting answers."""
    from . import efficiency

    if not manifest.slurm_submissions():
        return None
    try:
        return efficiency.markdown(efficiency.table_rows(manifest))
    except LaunchError as err:
        print(f"note: the report has no efficiency table: {err}", file=sys.stderr)
        return None


def _sync(args) -> int:
    """`launch.py sync SPEC`: W&B's own `wandb sync` over the offline W&B runs of the sweep's run directories."""
    import shutil
    import subprocess

    manifest = _launched(args)
    offline = sorted(str(d) for r in manifest.runs for d in (Path(r.out_dir) / "wandb").glob("offline-run-*"))
    if not offline:
        print(f"nothing to sync: no offline W&B run under the run directories of sweep {manifest.name}")
        return 0
    wandb = shutil.which("wandb") or str(Path(sys.executable).parent / "wandb")
    if not Path(wandb).exists():
        from tinygpt.config import TRACKING_EXTRA

        raise LaunchError(f"sync: the `wandb` command is not installed here; {TRACKING_EXTRA}")
    print(f"syncing {len(offline)} offline W&B run(s) (each life of a run is one) of sweep {manifest.name}",
          flush=True)
    done = subprocess.run([wandb, "sync", *(["--dry-run"] if args.dry_run else []), *offline])
    if done.returncode != 0:
        raise LaunchError(f"sync: wandb sync exited with status {done.returncode}; its output is above")
    return 0


def _logs(args) -> int:
    from . import logs, states
    from . import manifest as manifest_mod

    if args.tail is not None and args.tail < 1:
        raise LaunchError(f"--tail: must be >= 1, got {args.tail}")
    manifest = _launched(args)
    if args.follow:
        if args.run is None and len(manifest.runs) != 1:
            raise LaunchError("--follow: name the run to follow, e.g. `launch.py logs SPEC RUN --follow`")
        index = logs.find_run(manifest, args.run)[0].index

        def ended() -> bool:  # (read again: a resubmission may have given the run a new job meanwhile)
            return states.collect(manifest_mod.load(manifest.path))[index].state.ended

        logs.follow(manifest, args.run or str(index), ended)
        return 0
    nodes = {r.index: r.nodes for r in states.collect(manifest)}
    logs.show(manifest, args.run, args.tail, args.all, nodes)
    return 0


def _resubmit(args) -> int:
    from . import manifest as manifest_mod
    from . import resubmit

    states = resubmit.parse_states(args.states)
    changes = resubmit.parse_changes(args.time, args.mem, args.exclude)
    path = _manifest_path(args.spec, args.workdir)
    manifest_mod.load(path)  # (a sweep never launched is an error here, before the lock makes its folder)
    with manifest_mod.sweep_lock(path.parent):
        manifest = manifest_mod.load(path)  # (as it is once no other command can change it)
        rows = resubmit.collect_rows(manifest)
        if args.exclude_failed_nodes:
            bad = resubmit.failed_nodes(rows, manifest)
            print(f"nodes where a run ended in NODE_FAIL or HUNG: {', '.join(bad) or 'none'}")
            changes = resubmit.parse_changes(args.time, args.mem, [*args.exclude, *bad])
        ids = resubmit.resubmit(manifest, rows, states, changes, args.dry_run)
    if ids:
        print(f"submitted as job array {', '.join(ids)}; follow with `python launch.py status {args.spec}`")
    return 0


def _cancel(args) -> int:
    from . import backends

    manifest = _launched(args)
    ids = backends.of(manifest.backend).cancel(manifest)
    print(f"cancelled {', '.join(ids)}" if ids else "nothing to cancel: no job of this sweep was submitted to Slurm")
    return 0


# Each command's handler: hand the parsed arguments to the module that does it, print.
# (`check` is the launch command as a dry run that is checked: its defaults say so, in _launch_options)
HANDLERS = {"launch": _launch, "check": _launch, "status": _status, "cancel": _cancel, "report": _report, "sync": _sync,
            "resubmit": _resubmit, "logs": _logs, "schema": _schema, "profile": _profile}


if __name__ == "__main__":  # (python -m tinygpt.launch.cli: as launch.py, e.g. in the report step of a chain)
    sys.exit(main())
