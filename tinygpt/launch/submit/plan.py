"""From a validated sweep to files on disk, where layout.py says: the manifest (its typed records) and the job
array's batch scripts. Submits nothing. A run's config file is written from the manifest when its task starts
(run_config.py); the code the jobs import is the sweep's snapshot (snapshot.py) or the live checkout.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from tinygpt.base import durable
from tinygpt.launch import manifest as manifest_mod
from tinygpt.launch.layout import REPO_ROOT
from tinygpt.launch.manifest import CommandRecord, ManifestHead, SearchRecord
from tinygpt.launch.slurm import slurm_cli
from tinygpt.launch.submit.sbatch import ScriptParams, render

if TYPE_CHECKING:
    from tinygpt.launch.spec.sweep import Sweep
    from tinygpt.launch.submit.snapshot import Snapshot


class Records(NamedTuple):
    """A manifest's runs as a relaunch merges them (act/relaunch.py): what they share, each run's record,
    and the runs to submit now, by index."""

    base: dict[str, Any]
    runs: list[dict[str, Any]]
    submit: list[int]


class Script(NamedTuple):
    """One batch script of the job array: its runs are `indices`, task t running run `offset + t * pack`."""

    path: Path
    array: str  # the task ids it asks for, e.g. "0-3%2"
    offset: int
    indices: list[int]


@dataclass
class Plan:
    sweep: Sweep
    workdir: Path
    jobs_dir: Path
    logs_dir: Path
    manifest_path: Path
    scripts: list[Script]
    code: Path = REPO_ROOT  # what the jobs import: the sweep's code snapshot, or the live checkout

    @property
    def python(self) -> str:
        return self.sweep.profile.interpreter


def build(sweep: Sweep, snapshot: Snapshot | None = None, project: Snapshot | None = None,
          merged: Records | None = None, launch: int = 1) -> Plan:
    """Write the manifest and the batch scripts (the sbatch backend's). Submits nothing. The jobs run the code
    of `snapshot`, or the live checkout without one; a command's runs start in `project`, the user's. A
    relaunch's `merged` records are the manifest's runs, old and new, and the scripts are for its `submit`
    alone, named for the sweep's `launch`th launch."""
    dirs = sweep.dirs
    dirs.logs.mkdir(parents=True, exist_ok=True)
    previous = manifest_mod.load(dirs.manifest).submissions if dirs.manifest.exists() else []
    base, records = merged[:2] if merged else (sweep.runs[0].shared if sweep.runs else {}, _records(sweep))
    head = _head(sweep, snapshot, previous, base)
    if sweep.command is not None:
        c = sweep.command
        head.command = CommandRecord(argv=c.argv, project=str(project.path if project else sweep.project),
                                     stop_signal=sweep.profile.signal, heartbeat_s=c.heartbeat_s,
                                     max_requeues=c.max_requeues, start=c.start,
                                     resume_when=c.resume.when if c.resume else None,
                                     resume_add=c.resume.add if c.resume else [], progress=c.progress)
    indices = merged.submit if merged else list(range(len(sweep.runs)))
    written = (project if sweep.command is not None else snapshot)
    for i in indices if written else []:  # (what a relaunch compares when spec.code_counts asks it to)
        records[i] = {**records[i], "code": written.identity or written.digest}
    manifest_mod.create(dirs.manifest, head, records)
    code = snapshot.path if snapshot else REPO_ROOT
    scripts = _write_scripts(sweep, code, sorted(indices), len(records), launch) if sweep.backend == "sbatch" else []
    return Plan(sweep, sweep.workdir, dirs.jobs, dirs.logs, dirs.manifest, scripts, code)


def _head(sweep: Sweep, snapshot: Snapshot | None, previous: list, base: dict[str, Any]) -> ManifestHead:
    search = SearchRecord.model_validate({**sweep.search, "journal": str(sweep.dirs.journal)}) if sweep.search \
        else None
    return ManifestHead(format=manifest_mod.FORMAT, name=sweep.name, naming=sweep.naming,
                        spec=str(sweep.spec_path.resolve()),
                        backend=sweep.backend, cluster=sweep.profile.name, workdir=str(sweep.workdir),
                        logs_dir=str(sweep.dirs.logs), resources=sweep.resources.record(),
                        code=snapshot.record() if snapshot else {"snapshot": None, "path": str(REPO_ROOT)},
                        base=base, search=search, submissions=previous,
                        retry=sweep.retry.model_dump(mode="json") if sweep.retry else None)


def _records(sweep: Sweep) -> list[dict[str, Any]]:
    """Each run's record (RunRecord's fields) with only its own trainer inputs: the shared ones are the manifest's
    `base`, once (a run's config file is written from both when its task starts: run_config.py)."""
    return [{"index": run.index, "name": run.name, "own": run.own, "out_dir": run.out_dir,
             "max_steps": run.max_steps} for run in sweep.runs]


def _write_scripts(sweep: Sweep, code: Path, indices: list[int], runs: int, launch: int) -> list[Script]:
    """The job array's scripts for the runs `indices` (ascending) of a manifest of `runs`: one, or one per part
    when its tasks would reach MaxArraySize (Slurm's own when it is reachable, else the profile's). A part holds
    the runs `offset + task * pack ...`; packed runs are contiguous in a part, so that no task starts another."""
    limit = slurm_cli.max_array_size(sweep.profile.cluster_name) or sweep.profile.max_array_size
    size, pack = max(1, limit - 1), sweep.pack
    chunks: list[list[int]] = []
    for i in indices:
        if chunks and (i - chunks[-1][0]) // pack < size and (pack == 1 or i == chunks[-1][-1] + 1):
            chunks[-1].append(i)
        else:
            chunks.append([i])
    scripts = []
    for k, chunk in enumerate(chunks):
        path = sweep.dirs.script(k, len(chunks), launch)
        array = ranges(sorted({(i - chunk[0]) // pack for i in chunk}))
        if sweep.array_parallelism:
            array += f"%{sweep.array_parallelism}"
        durable.write(path, script_text(sweep, code, path, array, chunk[0], min(runs, chunk[-1] + 1)),
                      executable=True)
        scripts.append(Script(path, array, chunk[0], chunk))
    return scripts


def script_text(sweep: Sweep, code: Path, path: Path, array: str, offset: int, runs: int) -> str:
    """The batch script at `path` of the array tasks `array`, its task t running run `offset + t * pack` of a
    manifest of `runs`."""
    return render(ScriptParams(
        job_name=sweep.name, array=array, offset=offset, manifest=str(sweep.dirs.manifest),
        script_path=str(path), log_dir=str(sweep.dirs.logs), workdir=str(sweep.workdir),
        python=sweep.profile.interpreter, pythonpath=str(code), resources=sweep.resources,
        profile=sweep.profile, worker=sweep.search is not None, pack=sweep.pack, runs=runs,
        command=sweep.command is not None,
        torchrun=sweep.command is not None and sweep.command.start == "torchrun",
    ))


def ranges(tasks: list[int]) -> str:
    """Slurm's --array text for ascending task ids: `0-4,7,9-10` (`0-0` for one task, as sbatch shows it)."""
    spans: list[list[int]] = []
    for t in tasks:
        if spans and t == spans[-1][1] + 1:
            spans[-1][1] = t
        else:
            spans.append([t, t])
    if len(spans) == 1:
        return f"{spans[0][0]}-{spans[0][1]}"
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in spans)
