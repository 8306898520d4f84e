"""The launcher as a library, for notebooks and scripts: what the commands do, called from Python.

    from tinygpt.launch import api

    sweep = api.launch("jobs/tiny.yaml", workdir="work")       # or a spec built as a dict, with its `name`
    sweep.wait(timeout=1800)                                    # every run ended: a SweepStatus
    for run, records in sweep.metrics().items():
        print(run, [r["train_loss"] for r in records if "lr" in r])

The answers are typed: `Sweep.status()` is the document `launch.py status --json` prints, `check()` the one
`check --json` prints and `list_sweeps()` the entries of `list --json`, each made by the same code; `Sweep.logs()`
is what `launch.py logs` shows and `Sweep.report()` writes what `launch.py report` does. A refusal raises the
launcher's own errors (`LaunchError`, and its kinds: `SlurmAway` when Slurm does not answer, `SweepBusy` when
another command holds the sweep, `WaitTimeout`) with the messages the commands print; `exit_status` is the
command's. What a command prints along the way (the plan table, the hints) a call prints too. Importing this module
imports no torch and no Slurm command runs until called.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tinygpt.base import durable
from tinygpt.launch.errors import LaunchError, LoginAway, SlurmAway, SshRefused, SweepBusy, WaitTimeout

if TYPE_CHECKING:
    from tinygpt.launch.act.launch import CheckDocument
    from tinygpt.launch.manifest import Manifest
    from tinygpt.launch.read.log_files import RunLog
    from tinygpt.launch.remote.laptop import Target
    from tinygpt.launch.status.document import SweepStatus
    from tinygpt.launch.status.listing import SweepEntry

__all__ = ["LaunchError", "LoginAway", "RemoteSweep", "SlurmAway", "SshRefused", "Sweep", "SweepBusy", "WaitTimeout",
           "check", "launch", "list_sweeps", "new_profile", "open_sweep"]

Spec = str | os.PathLike[str] | Mapping[str, Any]  # a spec's file, or the spec itself (with its `name`)


class Sweep:
    """A sweep that was launched (or written by a dry run): its manifest, and what its runs are doing now."""

    def __init__(self, manifest_path: str | os.PathLike[str]) -> None:
        from tinygpt.launch import manifest

        self.path = Path(manifest_path)
        self.manifest: Manifest = manifest.load(self.path)  # (as it was read; `status()` reads it again if changed)
        self._stamp = _stamp(self.path)

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def runs(self) -> list[str]:
        """The runs' names, in the order of their numbers."""
        return [r.name for r in self.manifest.runs]

    def __repr__(self) -> str:
        return f"Sweep({self.name!r}, {len(self.manifest.runs)} run(s), manifest {str(self.path)!r})"

    def status(self) -> SweepStatus:
        """Every run's state, progress and losses now (asks Slurm): the document of `launch.py status --json`."""
        from tinygpt.launch.status import document

        return document.document(self.reload())

    def wait(self, timeout: float, poll: float = 5.0) -> SweepStatus:
        """Block until every run has ended (and a retry policy has written its summary, or the sweep was
        cancelled); its status then. WaitTimeout after `timeout` seconds, naming what has not ended: the runs go
        on. A Slurm that does not answer for a moment is waited out, as `status --watch` does."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                now = self.status()
                if now.ended:
                    return now
            except SlurmAway:
                now = None
            if time.monotonic() >= deadline:
                left = ", ".join(f"{r.name} ({r.state})" for r in now.runs if not r.ended) if now else "every run"
                raise WaitTimeout(f"sweep `{self.name}`: not ended after {timeout:g} s: {left or 'its retry policy'}; "
                                  f"the runs go on (wait again, or cancel them)")
            time.sleep(max(0.0, min(poll, deadline - time.monotonic())))

    def metrics(self, runs: Iterable[str] | None = None) -> dict[str, list[dict[str, Any]]]:
        """Each run's records ({name: records}, oldest first): its metrics.jsonl, every whole line (the trainer's
        steps, evaluations and events, or a program's own and its printed progress)."""
        from tinygpt.training import metrics

        wanted = None if runs is None else self._known(runs)
        return {r.name: list(metrics.read(metrics.of_run(r.out_dir))) for r in self.manifest.runs
                if wanted is None or r.name in wanted}

    def logs(self, run: str, every_life: bool = False) -> list[RunLog]:
        """The run's logs (`launch.py logs SPEC RUN`): its latest job's, the latest life of each; every job's whole
        logs with `every_life`. Each is (job, path, text); none: the run was never submitted to Slurm."""
        from tinygpt.launch.read.log_files import find_run, run_logs

        return run_logs(self.manifest, find_run(self.manifest, run)[0].index, every_life)

    def follow(self, run: str, poll: float = 0.5) -> Iterator[str]:
        """The run's newest job's log as it grows (`launch.py logs SPEC RUN --follow`): what each look, every `poll`
        seconds, found new (often ""), until the job has ended. A LaunchError when the run was never submitted."""
        from tinygpt.launch.read.log_files import find_run, follow

        manifest = self.reload()
        return follow(manifest, find_run(manifest, run)[0].index, poll)

    def efficiency(self, runs: Iterable[str] | None = None) -> list[dict[str, str]]:
        """How each run's latest job used its allocation (`launch.py status --efficiency`, one sacct call): a row of
        text by column (run, job, state, elapsed, CPUs, CPU eff, mem peak / asked, ...) for each run that went to
        Slurm, or for those of `runs`. SlurmAway when accounting does not answer."""
        from tinygpt.launch.read.efficiency import table_rows

        return table_rows(self.reload(), None if runs is None else self._known(runs))

    def report(self, prompt: str | None = None) -> Path:
        """`launch.py report`: the sweep's report written (loss curves, final losses, samples from `prompt`,
        attention maps, efficiency); its report.md."""
        from tinygpt.launch.read import sweep_report

        if sweep_report.make(self.reload(), prompt) != 0:
            raise LaunchError(f"sweep `{self.name}`: no report was written (see above)")
        return self.manifest.dirs.runs / "report.md"

    def cancel(self, runs: Sequence[str] | None = None) -> list[str]:
        """Every job of the sweep cancelled (`launch.py cancel`), its retry policy stopped; or only the newest job
        of each of `runs` (`--run`), which its policy never sends again; the jobs' ids."""
        from tinygpt.launch.act.cancel import cancel

        return cancel(self.path, runs)

    def resubmit(self, states: Sequence[str] | None = None, *, time: str | None = None, mem: str | None = None,
                 exclude: Sequence[str] = (), exclude_failed_nodes: bool = False, dry_run: bool = False) -> list[str]:
        """The runs whose latest job ended in one of `states` (default: those `launch.py resubmit` sends), again,
        with a new time limit, memory or nodes left out; the new jobs' ids."""
        from tinygpt.launch.act.resubmit import parse_states, resubmit
        from tinygpt.launch.read.run_states import RESUBMIT_DEFAULT

        chosen = parse_states(",".join(RESUBMIT_DEFAULT if states is None else states))
        return resubmit(self.path, chosen, time, mem, exclude, exclude_failed_nodes, dry_run)

    def reload(self) -> Manifest:
        """The manifest as its files have it now (a relaunch, a resubmission or a wave may have changed them): read
        again only when one changed, as a page asks every few seconds and a 10,000-run manifest takes 0.1 s to
        read."""
        from tinygpt.launch import manifest

        stamp = _stamp(self.path)
        if stamp is None or stamp != self._stamp:
            self.manifest, self._stamp = manifest.load(self.path), stamp
        return self.manifest

    def _known(self, runs: Iterable[str]) -> set[str]:
        """`runs` as a set, or a LaunchError naming those the sweep lacks."""
        wanted = set(runs)
        if unknown := sorted(wanted - set(self.runs)):
            raise LaunchError(f"runs: {', '.join(unknown)} not in sweep `{self.name}`; its runs: "
                              f"{', '.join(self.runs[:20])}{' ...' if len(self.runs) > 20 else ''}")
        return wanted


class RemoteSweep(Sweep):
    """A sweep launched from this laptop on a login node (a profile with `login:`): each call is made by the
    library there, over the profile's SSH connection, as the commands are (the answers are the same types); the
    laptop's code is sent when the sweep is opened. Its `manifest` is the login node's, read when opened and by
    `reload()`; its paths are the login node's."""

    def __init__(self, there: Target) -> None:
        from tinygpt.launch.remote import laptop

        self._there, self._name = there, there.record_path.parent.name  # (<workdir>/jobs/<name>/remote.json)
        self._library = laptop.library_there(there)
        self.path = Path(self._library.conn.root) / "jobs" / self._name / "manifest.json"
        self.manifest = laptop.manifest_there(self._library.conn, self._name)

    def status(self) -> SweepStatus:
        from tinygpt.launch.status.document import SweepStatus

        return SweepStatus.model_validate(self._call("status"))

    def metrics(self, runs: Iterable[str] | None = None) -> dict[str, list[dict[str, Any]]]:
        return dict(self._call("metrics", runs=None if runs is None else sorted(self._known(runs))))

    def logs(self, run: str, every_life: bool = False) -> list[RunLog]:
        from tinygpt.launch.read.log_files import RunLog

        return [RunLog(job, Path(path), text) for job, path, text in self._call("logs", run=run,
                                                                                every_life=every_life)]

    def follow(self, run: str, poll: float = 2.0) -> Iterator[str]:
        """As Sweep.follow: the newest job's whole log asked of the login node every `poll` seconds, and its run's
        state every fifth time."""
        from tinygpt.launch.read.log_files import find_run

        name = find_run(self.manifest, run)[0].name
        shown, job, looks, done = 0, None, 0, False
        while True:
            logs = self.logs(run, every_life=True)
            if not logs:
                raise LaunchError(f"run {run} was never submitted to Slurm: no log to follow")
            if logs[-1].job != job:  # (a resubmission's job: its log from the start)
                shown, job = 0, logs[-1].job
            yield logs[-1].text[shown:]
            shown = max(shown, len(logs[-1].text))
            if done:
                return
            if looks % 5 == 0:  # (one more look after the end, as Sweep.follow)
                done = next(r for r in self.status().runs if r.name == name).ended
            looks += 1
            time.sleep(poll)

    def efficiency(self, runs: Iterable[str] | None = None) -> list[dict[str, str]]:
        return list(self._call("efficiency", runs=None if runs is None else sorted(self._known(runs))))

    def report(self, prompt: str | None = None) -> Path:
        """The report written on the login node (with the jobs' Python) and brought back with the runs' metrics,
        as `launch.py report` does from a laptop; its report.md here."""
        from tinygpt.launch.remote import laptop

        laptop.library_there(self._there, jobs_python=True).call(str(self.path), "report", {"prompt": prompt})
        workdir = self._there.record_path.parents[2]
        laptop.pull_there(self._library.conn, self._name, str(workdir))
        return workdir / "runs" / self._name / "report.md"

    def cancel(self, runs: Sequence[str] | None = None) -> list[str]:
        return list(self._call("cancel", runs=None if runs is None else list(runs)))

    def resubmit(self, states: Sequence[str] | None = None, *, time: str | None = None, mem: str | None = None,
                 exclude: Sequence[str] = (), exclude_failed_nodes: bool = False, dry_run: bool = False) -> list[str]:
        return list(self._call("resubmit", states=None if states is None else list(states), time=time, mem=mem,
                               exclude=list(exclude), exclude_failed_nodes=exclude_failed_nodes, dry_run=dry_run))

    def reload(self) -> Manifest:
        from tinygpt.launch.remote import laptop

        self.manifest = laptop.manifest_there(self._library.conn, self._name)
        return self.manifest

    def _call(self, method: str, **arguments: Any) -> Any:
        return self._library.call(str(self.path), method, arguments)


REMOTE_CALLS = ("status", "metrics", "logs", "efficiency", "report", "cancel", "resubmit")  # (what RemoteSweep asks)


def _answer(argv: list[str]) -> int:
    """`python -m tinygpt.launch.api MANIFEST METHOD ARGUMENTS`: a laptop's call of a Sweep (RemoteSweep), made
    here on the login node; printed as one JSON document, {"answer": ...} or {"error": [kind, message]}. What
    the call prints along the way goes to stderr, which the laptop shows."""
    import contextlib
    import sys

    manifest, method, arguments = argv
    try:
        if method not in REMOTE_CALLS:
            raise LaunchError(f"{method}: not a call a laptop makes of a sweep ({', '.join(REMOTE_CALLS)})")
        with contextlib.redirect_stdout(sys.stderr):
            answer = getattr(Sweep(manifest), method)(**json.loads(arguments))
        said: dict[str, Any] = {"answer": _as_json(answer)}
    except LaunchError as err:
        said = {"error": [type(err).__name__, str(err)]}
    print(json.dumps(said))
    return 0


def _as_json(answer: Any) -> Any:
    """A call's answer as JSON: a document's fields, a log's (job, path, text), a path as text."""
    from pydantic import BaseModel

    if isinstance(answer, BaseModel):
        return answer.model_dump(mode="json")
    if isinstance(answer, Path):
        return str(answer)
    if isinstance(answer, list):
        return [[str(x) for x in item] if isinstance(item, tuple) else item for item in answer]
    return answer


Stamp = tuple[tuple[int, int, int] | None, ...]


def _stamp(path: Path) -> Stamp | None:
    """The manifest's file and its submissions' record, each by inode, size and time, to tell that either changed
    (the manifest is replaced whole: a new inode; a submission is appended to the record: a new size); None
    without a manifest."""
    from tinygpt.launch.manifest import submissions_record

    stamps: list[tuple[int, int, int] | None] = []
    for file in (path, submissions_record(path)):
        try:
            stat = os.stat(file)
            stamps.append((stat.st_ino, stat.st_size, stat.st_mtime_ns))
        except OSError:
            stamps.append(None)
    return None if stamps[0] is None else tuple(stamps)


def launch(spec: Spec, workdir: str | os.PathLike[str] = ".", *, cluster: str | None = None,
           backend: str | None = None, set: Mapping[str, Any] | None = None, dry_run: bool = False,
           local: bool = False, chain: bool = False, hold: bool = False, nproc: int = 1, check: bool = True,
           snapshot: bool = True, fresh: bool = False) -> Sweep:
    """`launch.py SPEC`: the spec checked (against the live cluster too, unless `check=False`), its scripts and
    manifest written, its runs submitted (`dry_run`: nothing submitted; `local`: run here, one after another). A
    spec launched before submits only its new runs. The keywords are the command's options."""
    from tinygpt.launch.act.launch import LaunchOptions, run
    from tinygpt.launch.remote import laptop

    with _spec_file(spec, workdir, keep="launched") as path:
        there = None if local else laptop.launch_target(str(path), str(workdir), cluster)
        if there is None:
            run(LaunchOptions(spec=str(path), workdir=str(workdir), cluster=cluster, backend=backend,
                              set=_words(set), dry_run=dry_run, local=local, chain=chain, hold=hold, nproc=nproc,
                              no_check=not check, no_snapshot=not snapshot, fresh=fresh))
        else:  # (a profile with `login:`: the launch runs there, as `launch.py SPEC --cluster NAME` does)
            flags = {"--dry-run": dry_run, "--chain": chain, "--hold": hold, "--no-check": not check,
                     "--no-snapshot": not snapshot, "--fresh": fresh}
            options = [*(["--backend", backend] if backend else []), *[w for v in _words(set) for w in ("--set", v)],
                       *(["--nproc", str(nproc)] if nproc != 1 else []), *[f for f, on in flags.items() if on]]
            if (status := laptop.launch_there(there, str(path), options)) != 0:
                raise LaunchError(f"{path}: the launch on {there.login.host} ended with exit status {status} (its "
                                  f"words are above)")
    return open_sweep(path, workdir)


def check(spec: Spec, workdir: str | os.PathLike[str] = ".", *, cluster: str | None = None,
          backend: str | None = None, set: Mapping[str, Any] | None = None) -> CheckDocument:
    """`launch.py check SPEC --json`: the spec against the live cluster and Slurm's estimates; nothing is written
    or submitted. A spec that does not fit is an answer (`ok` false, its `problems`), not an exception."""
    from tinygpt.launch.act.launch import LaunchOptions, check_document

    with _spec_file(spec, workdir, keep="never") as path:
        return check_document(LaunchOptions(spec=str(path), workdir=str(workdir), cluster=cluster, backend=backend,
                                            set=_words(set), command="check", dry_run=True))


def list_sweeps(workdir: str | os.PathLike[str] = ".") -> list[SweepEntry]:
    """Every sweep under `workdir` (`launch.py list --json`), by name: its cluster, runs by state and when it
    last changed, or the problem that keeps its manifest from being read."""
    from tinygpt.launch.status.listing import listing

    return listing(Path(workdir)).sweeps


def new_profile(directory: str | os.PathLike[str] | None = None, *, name: str | None = None, force: bool = False,
                login: str | None = None, ssh_options: Sequence[str] = ()) -> Path:
    """`launch.py profile new`: a cluster profile written from what the reachable Slurm says (with `login`,
    USER@HOST, the Slurm of that login node, asked over SSH, and the login: section that reaches it; `ssh_options`
    its KEY=VALUE options), in `directory` (default: hpc_lab/clusters inside the checkout, else the user's profile
    folder), named `name` (default: Slurm's ClusterName); the written file's path. Never written over without
    `force`; nothing is written when Slurm does not answer."""
    from tinygpt.launch import profile_new

    return profile_new.new(None if directory is None else Path(directory), name, force, login, list(ssh_options))


def open_sweep(spec: str | os.PathLike[str], workdir: str | os.PathLike[str] = ".") -> Sweep:
    """The sweep that a spec launched (its YAML, or the sweep's jobs/<name>/manifest.json) under `workdir`; one
    launched from here on a login node answers from there (a `RemoteSweep`)."""
    from tinygpt.launch.remote import laptop
    from tinygpt.launch.spec.sweep import manifest_path

    there = laptop.sweep_target(str(spec), str(workdir))
    return RemoteSweep(there) if there is not None else Sweep(manifest_path(spec, workdir))


@contextmanager
def _spec_file(spec: Spec, workdir: str | os.PathLike[str], keep: Literal["launched", "never"]) -> Iterator[Path]:
    """A spec's file for the commands' code: the one given, or a spec given as a mapping written as
    `<workdir>/<name>.yaml`. That file stays only where the call launched the sweep (`keep="launched"`: its
    manifest exists, so that the commands can follow it: `launch.py status <name>.yaml`); a refusal or a check
    leaves nothing behind. A file there already is never written over with another spec, nor removed."""
    if not isinstance(spec, Mapping):
        yield Path(spec)
        return
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise LaunchError("name: a spec given as a mapping needs its `name` (its file is written as <name>.yaml "
                          "in the work directory)")
    import yaml  # type: ignore[import-untyped]  # (no stubs in the venv; safe_dump is all it uses)

    from tinygpt.launch.layout import REMOTE_RECORD, check_safe_name
    from tinygpt.launch.spec.sweep import manifest_path

    problems: list[str] = []
    check_safe_name(name, "name", problems)
    if problems:
        raise LaunchError(problems)
    path = Path(workdir) / f"{name}.yaml"
    text = yaml.safe_dump(dict(spec), sort_keys=False, allow_unicode=True)
    ours = not path.exists()
    if not ours and path.read_text(errors="replace") != text:
        raise LaunchError(f"name: {path} holds another spec; give this one another `name`, or launch that file")
    if ours:
        path.parent.mkdir(parents=True, exist_ok=True)
        durable.write(path, text)
    try:
        yield path
    finally:
        launched = manifest_path(path, workdir)  # (here, or on a login node: its record is here)
        if ours and (keep == "never" or not (launched.exists() or launched.with_name(REMOTE_RECORD).exists())):
            path.unlink(missing_ok=True)


def _words(values: Mapping[str, Any] | None) -> list[str]:
    """`set=` as the command's `--set KEY=VALUE` words: a text as written, anything else as JSON (which YAML
    reads back as the same value: 300, 0.001, true, null)."""
    return [f"{key}={value if isinstance(value, str) else json.dumps(value)}" for key, value in (values or {}).items()]


if __name__ == "__main__":  # (a laptop's RemoteSweep call, on the login node)
    import sys

    sys.exit(_answer(sys.argv[1:]))
