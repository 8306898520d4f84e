"""`python launch.py`: YAML jobs and sweeps to Slurm (sbatch job arrays or submitit), or to this machine.

    python launch.py SPEC.yaml                  validate, write scripts and manifest, submit
    python launch.py SPEC.yaml --dry-run        the same without submitting: a table of runs and resources
    python launch.py check SPEC.yaml            the spec against the live cluster, then sbatch --test-only
    python launch.py SPEC.yaml --local          run every run here on CPU, one after another
    python launch.py SPEC.yaml --chain          data job -> training array (afterok) -> report job (afterany)
    python launch.py status SPEC.yaml [--watch] a table of the sweep's runs [--json: one JSON document]
    python launch.py cancel SPEC.yaml           scancel the sweep's jobs
    python launch.py resubmit SPEC.yaml         the runs that failed, hung or were preempted, again
                     [--time T] [--mem M] [--exclude NODES] [--exclude-failed-nodes] [--states S,...] [--dry-run]
    python launch.py heal SPEC.yaml             one pass of the spec's `retry:` policy (what its heal job runs)
    python launch.py report SPEC.yaml           loss curves, final losses, samples, attention maps
    python launch.py logs SPEC.yaml [RUN]       a run's Slurm log, its latest life [--tail N] [--follow] [--all]
    python launch.py sync SPEC.yaml             upload the sweep's offline W&B runs (wandb sync), from a login node
    python launch.py pull SPEC.yaml             a sweep launched over SSH: its report and metrics here [--checkpoints]
    python launch.py list                       every sweep under --workdir: cluster, runs by state [--json]
    python launch.py serve [SPEC.yaml]          the sweeps as live pages in a browser (loopback, a link with a token)
    python launch.py schema [spec|profile|status|check|list]  the JSON Schema of a spec, a profile, a --json [--write]
    python launch.py profile new                a cluster profile from what Slurm says [--name N] [--force]
                                                [--login USER@HOST: that login node's, from a laptop]

`launch.py COMMAND --help` lists a command's options (`launch.py launch --help`: those of `launch.py SPEC`).
Errors in the spec are all reported at once, and nothing is submitted; the exit status is 1. When Slurm's controller
or its accounting does not answer (a restart, a failover), a command that needs it refuses at once with exit status
75 (try again later).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tinygpt.base.errors import blank_arguments, not_utf8
from tinygpt.launch import console
from tinygpt.launch.errors import LaunchError

if TYPE_CHECKING:
    from tinygpt.launch.manifest import Manifest


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
    _status_options(command("status", "a table of the sweep's runs"))
    p = command("cancel", "scancel the sweep's jobs")
    p.add_argument("--run", action="append", metavar="RUN",
                   help="only this run's newest job (a name or number; repeatable): the rest go on")
    _resubmit_options(command("resubmit", "the runs that failed, hung or were preempted, again"))
    command("heal", "one pass of the sweep's retry policy: the runs it allows, again, as the next round, or the "
                    "summary at the end (what the sweep's heal job runs after each round)")
    p = command("report", "loss curves, final losses, samples, attention maps")
    p.add_argument("--prompt", default=None, help="prompt for the attention maps and samples")
    p = command("logs", "a run's Slurm log, its latest life")
    p.add_argument("run", nargs="?", help="a run's name or number (default: every run)")
    p.add_argument("--tail", type=int, metavar="N", help="only the last N lines of each log")
    p.add_argument("--follow", action="store_true", help="keep printing the run's log as it grows")
    p.add_argument("--all", action="store_true", help="every job of the run, every life, not only the latest")
    p = command("pull", "bring back a sweep launched on a cluster over SSH: its report, every run's metrics")
    p.add_argument("--checkpoints", action="store_true", help="every run's checkpoints too")
    p = command("sync", "upload the sweep's offline W&B runs (wandb sync), from a login node")
    p.add_argument("--dry-run", action="store_true", help="show what W&B would upload, upload nothing")
    _other_commands(commands)
    return top


def _other_commands(commands) -> None:
    """The commands without a spec: list, serve, profile, schema."""
    from tinygpt.launch.commands import json_schema

    p = commands.add_parser("list", help="every sweep under a work directory: cluster, runs by state, last change")
    p.add_argument("--workdir", default=".", help="where jobs/, logs/ and runs/ are (default: here)")
    p.add_argument("--json", action="store_true", help="one JSON document instead of the lines")
    p = commands.add_parser("serve", help="the sweeps of a work directory as live pages in a browser",
                            description="Serve the sweeps of a work directory on this machine's loopback, to the "
                                        "holder of the link it prints: each sweep's runs, curves and logs, live; "
                                        "cancel from the page. From a laptop, through an SSH forward.")
    p.add_argument("spec", nargs="?", help="a sweep's spec (or manifest.json): the link printed opens its page")
    p.add_argument("--workdir", default=".", help="where jobs/, logs/ and runs/ are (default: here)")
    p.add_argument("--port", type=int, default=0, help="the loopback port (default: a free one)")
    p.add_argument("--cluster", help="from a laptop: serve on this profile's login node and forward a port of this "
                                     "machine to it over SSH (a sweep launched from here with --cluster goes there "
                                     "by itself)")
    p.add_argument("--idle-minutes", type=float, default=60.0, help="stop after this long with no page open "
                                                                    "(default: 60)")
    p = commands.add_parser("profile", help="a cluster profile written from what the reachable Slurm says",
                            description="`profile new`: ask the reachable Slurm (scontrol, sacctmgr) and write "
                                        "<ClusterName>.yaml, a comment on every guess.")
    p.add_argument("action", choices=("new",))
    p.add_argument("--name", help="the profile's name (default: Slurm's ClusterName)")
    p.add_argument("--force", action="store_true", help="write over a profile of that name")
    p.add_argument("--dir", help="where to write it (default: ~/.config/tinygpt-hpc/clusters; here: hpc_lab/clusters)")
    p.add_argument("--login", metavar="USER@HOST", help="from a laptop: ask the Slurm of this login node, over SSH, "
                                                        "and give the profile the login: section that reaches it")
    p.add_argument("--ssh-option", action="append", default=[], metavar="KEY=VALUE",
                   help="with --login: an ssh -o option for its login: section, e.g. ProxyJump=gateway (repeatable)")
    p = commands.add_parser("schema", help="the JSON Schema of a spec, a cluster profile or a command's --json",
                            description="The JSON Schema that specs (jobs/*.yaml) or cluster profiles are checked "
                                        "with, for editors; or that the documents of `status --json`, `check --json` "
                                        "and `list --json` follow.")
    p.add_argument("kind", nargs="?", choices=json_schema.KINDS, default="spec",
                   help="default: spec")
    p.add_argument("--write", action="store_true", help="write each into schemas/ (what a test compares)")


def _launch_options(p: argparse.ArgumentParser, submits: bool = True) -> None:
    """The options of `launch.py SPEC`; `check`, which submits nothing, has those that shape the plan alone."""
    p.add_argument("--cluster", help="a profile's name (found in $TINYGPT_CLUSTERS, ~/.config/tinygpt-hpc/clusters, "
                                     "hpc_lab/clusters), its path, or auto (overrides the spec's `cluster`)")
    p.add_argument("--backend", help="sbatch or submitit (overrides the spec's `backend`)")
    p.add_argument("--chain", action="store_true",
                   help="three jobs: data preparation, the training array after it, the sweep report after that")
    p.add_argument("--no-snapshot", action="store_true",
                   help="jobs import the live checkout when they start, not a snapshot of the code as it is now")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="set a trainer key for every run, e.g. --set max_steps=300 (repeatable)")
    p.add_argument("--fresh", action="store_true",
                   help="launched again: start the runs the spec now defines otherwise anew, their old directories "
                        "moved aside (without it, such a run is refused)")
    if not submits:
        p.add_argument("--json", action="store_true",
                       help="one JSON document of the outcome, for scripts (its schema: `launch.py schema check`)")
        p.set_defaults(dry_run=True, local=False, hold=False, nproc=1, no_check=False)
        return
    p.add_argument("--dry-run", action="store_true", help="write scripts and manifest, submit nothing")
    p.add_argument("--local", action="store_true", help="run here on CPU instead of submitting")
    p.add_argument("--hold", action="store_true",
                   help="submit held (sbatch --hold); start them with `scontrol release JOBID`")
    p.add_argument("--nproc", type=int, default=1, help="with --local: gloo ranks per run (default 1)")
    p.add_argument("--no-check", action="store_true",
                   help="submit without checking the spec against the live cluster first (see `launch.py check`)")


def _status_options(p: argparse.ArgumentParser) -> None:
    from tinygpt.launch.read.run_states import SUMMARY_ABOVE

    p.add_argument("--watch", action="store_true", help="refresh until every run has ended")
    p.add_argument("--interval", type=float, default=5.0,
                   help=f"seconds between refreshes, from {WATCH_S[0]} to {WATCH_S[1]:,} (default: %(default)s)")
    p.add_argument("--efficiency", action="store_true",
                   help="how each run used its allocation: CPU and memory efficiency, GPU use (sacct)")
    p.add_argument("--json", action="store_true",
                   help="one JSON document instead of the table, for scripts (its schema: `launch.py schema status`)")
    p.add_argument("--all", action="store_true", dest="every_row",
                   help=f"a row for every run (a sweep of more than {SUMMARY_ABOVE} runs is otherwise shown as its "
                        f"runs by state, with the failed and running ones listed)")


def _resubmit_options(p: argparse.ArgumentParser) -> None:
    from tinygpt.launch.read.run_states import RESUBMIT_DEFAULT

    p.add_argument("--states", default=",".join(RESUBMIT_DEFAULT),
                   help="resubmit the runs whose latest job ended in one of these (default: %(default)s)")
    p.add_argument("--time", help="a new time limit, e.g. 04:00:00")
    p.add_argument("--mem", help="a new memory request, e.g. 16G")
    p.add_argument("--exclude", action="append", default=[], metavar="NODES",
                   help="nodes not to run on, e.g. node3 or node[3-4] (repeatable)")
    p.add_argument("--exclude-failed-nodes", action="store_true",
                   help="also exclude the nodes on which a run of this sweep ended in NODE_FAIL, BOOT_FAIL or HUNG")
    p.add_argument("--dry-run", action="store_true", help="say what would be resubmitted, submit nothing")


# The commands that run on the login node of a profile with `login:`, or of a sweep launched with one (remote/laptop.py)
FORWARDED = ("launch", "check", "status", "cancel", "resubmit", "report", "logs", "sync", "pull")
WATCH_S = (1.0, 3600.0)  # status --watch's interval: no faster than a second (a shared controller), at most an hour


def _status(args: argparse.Namespace) -> int:
    if not WATCH_S[0] <= args.interval <= WATCH_S[1]:  # (a NaN is in no range)
        raise LaunchError(f"--interval: {args.interval} is not a number of seconds from {WATCH_S[0]:g} to "
                          f"{WATCH_S[1]:,.0f}; give one in that range")
    if args.json and (args.watch or args.efficiency):
        raise LaunchError("--json: one document of the runs' states, printed once; drop --watch and --efficiency")
    if args.json:
        from tinygpt.launch import api

        print(api.open_sweep(args.spec, args.workdir).status().model_dump_json(indent=2))
        return 0
    manifest = _launched(args)
    from tinygpt.launch.status import table

    if args.efficiency:
        table.show_efficiency(manifest)
        return 0
    table.show(manifest, watch=args.watch, interval=args.interval, every_row=args.every_row)
    return 0


def _schema(args: argparse.Namespace) -> int:
    from tinygpt.base import durable
    from tinygpt.launch.commands import json_schema

    if not args.write:
        print(json_schema.text(args.kind), end="")
        return 0
    for kind in json_schema.KINDS:
        json_schema.path(kind).parent.mkdir(exist_ok=True)
        durable.write(json_schema.path(kind), json_schema.text(kind))
        print(f"wrote {json_schema.path(kind)}")
    return 0


def _profile(args: argparse.Namespace) -> int:
    from tinygpt.launch import profile_new

    path = profile_new.new(Path(args.dir) if args.dir else None, args.name, args.force, args.login, args.ssh_option)
    print(f"wrote {path}: read it through; the values marked as guesses, and what Slurm could not say, are "
          f"commented at their lines. Launch with `--cluster {path.stem}` (or `--cluster auto`)")
    return 0


def _launched(args: argparse.Namespace) -> Manifest:
    """The sweep that the command's SPEC launched, loaded once for the command."""
    from tinygpt.launch import manifest
    from tinygpt.launch.spec.sweep import manifest_path

    return manifest.load(manifest_path(args.spec, args.workdir))


def main(argv: list[str] | None = None) -> int:
    invoked_here = argv is None
    if invoked_here:
        signal.signal(signal.SIGINT, console.interrupted)
    argv = sys.argv[1:] if argv is None else argv
    if problems := not_utf8(argv):
        print(f"error: {LaunchError(problems)}", file=sys.stderr)
        return 1
    try:
        top = parser()  # (in the try: a Ctrl-C that lands while it imports what it needs ends the command 130)
        _complete(top)
        if argv and argv[0] not in HANDLERS and argv[0] not in ("-h", "--help"):
            argv = ["launch", *argv]  # (`launch.py SPEC`)
        args = top.parse_args(argv)
        if invoked_here:  # (the hints say the command as the user runs it; a test's call keeps `python launch.py`)
            console.invoked(sys.argv[0], getattr(args, "workdir", None))
        if problems := _blank(top, args):
            raise LaunchError(problems)
        if args.command in FORWARDED:  # (a profile with `login:`, or a sweep launched with one: over SSH)
            from tinygpt.launch.remote import laptop

            if (there := laptop.target(args)) is not None:
                return laptop.forward(there, top, args)
        return HANDLERS[args.command](args)
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_status
    except OSError as err:  # the filesystem refused (full, read-only, permissions): nothing half-written
        from tinygpt.base.errors import filesystem_message

        print(f"error: {filesystem_message(err)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception:
        if console.INTERRUPTS:  # (a Ctrl-C that a library turned into its own error: pydantic, building a validator)
            return 130
        raise


def _complete(top: argparse.ArgumentParser) -> None:
    """Shell completion (argcomplete; `eval "$(register-python-argcomplete tinygpt-launch)"`): when the shell
    asks, the commands, their options, spec files and a sweep's run names are said and the process exits; else
    nothing (argcomplete is not even imported)."""
    if "_ARGCOMPLETE" not in os.environ:
        return
    import argcomplete
    from argcomplete.completers import FilesCompleter

    commands = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    for sub in commands.choices.values():
        for action in sub._actions:
            if action.dest == "spec":
                action.completer = FilesCompleter(("yaml", "yml", "json"))
            elif action.dest == "run":
                action.completer = _run_names
    argcomplete.autocomplete(top)


def _run_names(prefix: str, parsed_args: argparse.Namespace, **_) -> list[str]:
    """The names of the sweep's runs that start with `prefix` (none when its manifest cannot be read)."""
    try:
        return [r.name for r in _launched(parsed_args).runs if r.name.startswith(prefix)]
    except (LaunchError, OSError):
        return []


def _blank(top: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The options of the command given as an empty or blank text (errors.blank_arguments)."""
    commands = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return blank_arguments(commands.choices[args.command]._actions, args)


def _launch(args) -> int:
    import dataclasses

    from tinygpt.launch.act.launch import LaunchOptions, check_document, run

    options = LaunchOptions(**{f.name: getattr(args, f.name) for f in dataclasses.fields(LaunchOptions)})
    if args.command == "check" and args.json:
        document = check_document(options)
        print(document.model_dump_json(indent=2))
        return document.exit_status
    return run(options)


def _report(args) -> int:
    """`launch.py report SPEC`: runs/<sweep>/report.md over every run of the sweep's manifest."""
    from tinygpt.launch.read import sweep_report

    return sweep_report.make(_launched(args), args.prompt)


def _sync(args) -> int:
    from tinygpt.launch.commands.wandb_sync import sync

    sync(_launched(args), args.dry_run)
    return 0


def _logs(args) -> int:
    from tinygpt.launch.commands import logs

    if args.tail is not None and args.tail < 1:
        raise LaunchError(f"--tail: must be >= 1, got {args.tail}")
    logs.run(_launched(args), args.run, args.tail, args.all, args.follow)
    return 0


def _resubmit(args) -> int:
    from tinygpt.launch import api
    from tinygpt.launch.act.resubmit import parse_states

    states = parse_states(args.states)  # (a wrong word is said before the sweep is looked for)
    ids = api.open_sweep(args.spec, args.workdir).resubmit(
        states, time=args.time, mem=args.mem, exclude=args.exclude, exclude_failed_nodes=args.exclude_failed_nodes,
        dry_run=args.dry_run)
    if ids:
        print(f"submitted as job array {', '.join(ids)}; follow with `{console.next_command('status', args.spec)}`")
    return 0


def _pull(args) -> int:
    raise LaunchError(f"pull: {args.spec} was not launched on a cluster from here; pull brings back what a sweep "
                      f"launched with `--cluster NAME` (a profile with `login:`) made there")


def _heal(args) -> int:
    from tinygpt.launch.heal import heal_pass
    from tinygpt.launch.spec.sweep import manifest_path

    return heal_pass.run(manifest_path(args.spec, args.workdir))


def _cancel(args) -> int:
    from tinygpt.launch import api

    ids = api.open_sweep(args.spec, args.workdir).cancel(args.run)
    print(f"cancelled {', '.join(ids)}" if ids else "nothing to cancel: no job of this sweep was submitted to Slurm")
    return 0


# Each command's handler: hand the parsed arguments to the module that does it, print.
# (`check` is the launch command as a dry run that is checked: its defaults say so, in _launch_options)
def _serve(args) -> int:
    from tinygpt.launch.remote import laptop
    from tinygpt.launch.serve import page_forward, server

    server.check_options(args.port, args.idle_minutes)
    if (there := laptop.target(args)) is not None:  # (a login node's sweeps, seen from here through a forward)
        return page_forward.serve(there, args)
    sweep = None
    if args.spec:
        from tinygpt.launch.spec.sweep import manifest_path

        sweep = manifest_path(args.spec, args.workdir).parent.name
    return server.serve(Path(args.workdir), args.port, args.idle_minutes * 60, sweep)


def _list(args) -> int:
    from tinygpt.launch.commands import list_sweeps

    return list_sweeps.show(Path(args.workdir), args.json)


HANDLERS = {"launch": _launch, "check": _launch, "status": _status, "cancel": _cancel, "report": _report, "sync": _sync,
            "resubmit": _resubmit, "heal": _heal, "logs": _logs, "schema": _schema, "profile": _profile, "pull": _pull,
            "list": _list, "serve": _serve}


if __name__ == "__main__":  # (python -m tinygpt.launch.commands.cli: as launch.py, e.g. in the report step of a chain)
    sys.exit(main())
