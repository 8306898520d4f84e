"""`jobs/<sweep>/manifest.json`: the runs of a sweep, where they live, and the jobs that run them.

Written by the launcher before anything is submitted, and read by every array task on the nodes (run_config.py)
and by `launch.py status|cancel|report|logs|resubmit`. Each submission's job ids are appended to
`submissions.jsonl` beside it, a line each, as soon as Slurm has given them (the manifest of a 100,000-run sweep
is written once, not again after each of its 100 array parts); every reader sees the manifest's own submissions
and then that file's. The records are typed (pydantic, strict): a damaged file is refused with what to do, never
half-read.
"""

from __future__ import annotations

import glob
import json
import os
import re
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from tinygpt.base import durable, schema
from tinygpt.launch.errors import LaunchError, SweepBusy
from tinygpt.launch.layout import SUBMISSIONS, SweepDirs
from tinygpt.training.rundir_lock import RunDirLock, describe

LOCK_WAIT_S = 5.0  # a second command on the same sweep waits this long for the first, then refuses

FORMAT = 2  # runs keep their trainer inputs (shared ones once, in "base")
BACKENDS = ("sbatch", "submitit")  # the Slurm backends a spec may name (backends.py implements them)
LOCAL = "local"  # the backend of a submission that ran here (--local): no Slurm job


def sweep_lock(jobs_dir: Path) -> RunDirLock:
    """One writer per sweep: held (`with sweep_lock(...)`) by every command that writes a sweep's files, submits
    its jobs or records them. The run-directory lock's mechanism, so it holds where flock does not."""
    return RunDirLock(jobs_dir, busy=_sweep_busy, wait_s=LOCK_WAIT_S)


def _sweep_busy(jobs_dir: Path, holder: dict) -> SweepBusy:
    return SweepBusy(f"sweep `{jobs_dir.name}` is being changed by another launch.py command ({describe(holder)}); "
                       f"nothing was written; run this again once it has ended (or stop it: kill {holder.get('pid')})")


class _Record(BaseModel):
    """A record of the manifest as a command reads it: each key it reads has the type it is read as (strict:
    a damaged 3 for "3" is damage), and keys it does not read are kept as they are."""

    model_config = ConfigDict(extra="allow", strict=True)


class RunRecord(_Record):
    index: int
    name: str
    # The run's own trainer inputs (those that differ between the sweep's runs); manifests written before the key
    # was named `own` call it `overrides`.
    own: dict = Field(validation_alias=AliasChoices("own", "overrides"))
    out_dir: str  # (written only where it is not <workdir>/runs/<sweep>/<name>: `Manifest` fills that in)
    max_steps: int | None = None
    code: str | None = None  # the digest of the code it was last written for (a relaunch's spec.code_counts)


class Life(_Record):
    """A run's earlier job, as `launch.py resubmit` keeps it when it submits the run again."""

    job_id: str
    state: str
    nodes: str = ""
    end: str | None = None  # a retry policy's word for how it ended (heal/ends.py)


class Submission(_Record):
    """One submission to a backend (or a --local run): which runs, as which job."""

    backend: str
    job_id: str
    indices: list[int]
    submitted_at: float
    role: str | None = None  # a chain's data or report step; a retry policy's heal job or summary (notify)
    round: int | None = None  # a retry policy's: the sweep's round this submission began (the launch is round 1)
    array: str | None = None  # sbatch: the task ids asked for
    offset: int = 0  # sbatch: the index of the run of the array's task 0
    script: str | None = None
    pack: int = Field(1, ge=1)  # sbatch: runs per task
    per_run_ids: dict[str, str] | None = None  # submitit: each run's job id
    folder: str | None = None
    python: str | None = None
    executor: dict | None = None  # submitit: the executor's parameters
    task: str | None = None  # submitit: the import path of the class its jobs unpickle (node/train_task.py)
    changes: dict[str, str] | None = None  # resubmit: the sbatch options changed
    previous: dict[str, Life] | None = None  # resubmit: each run's job before this one

    @property
    def to_slurm(self) -> bool:
        return self.backend != LOCAL

    def task_of(self, index: int) -> str:
        """The Slurm id of run `index`'s job in this submission (`<array>_<task>` for array tasks)."""
        if self.array:  # (`pack` runs share each task)
            return f"{self.job_id}_{(index - self.offset) // self.pack}"
        return self.per_run_ids[str(index)] if self.per_run_ids is not None else self.job_id


class WaveScript(_Record):
    """Runs of one batch script that go out in waves: each wave is `sbatch --array=<their tasks>` of it."""

    script: str
    offset: int
    pack: int = Field(1, ge=1)
    indices: list[int]


class WavesRecord(_Record):
    """`jobs/<sweep>/waves.json`: the runs a launch let wait for a wave, and what decides a wave's size. Written
    under the sweep's lock by a launch (a relaunch adds to it); a run waits while no submission names it, so the
    submissions record alone says what went out, and a run is never sent twice."""

    format: Literal[1] = 1
    scripts: list[WaveScript]
    account: str | None = None  # whose limits apply (None: the user's default account)
    qos: list[str] = []  # the QOS whose limits apply: the job's and its partition's
    margin: int = Field(0, ge=0)  # places of the limit left to the user's other jobs
    throttle: int | None = None  # array_parallelism: `%N` of each wave's --array
    report: str | None = None  # a chain's report step's script: sent by the heal job that sends the last wave


def load_waves(dirs: SweepDirs) -> WavesRecord | None:
    """The sweep's waves record; None when it has none (all its runs went out at once)."""
    try:
        text = dirs.waves.read_text()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise _damaged(dirs.waves, str(err)) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise _damaged(dirs.waves, f"not JSON: {err}") from None
    try:
        return WavesRecord.model_validate(data)
    except ValidationError as err:
        raise _damaged(dirs.waves, schema.messages(err, WavesRecord)[0]) from None


class SearchRecord(_Record):
    """An Optuna search: its space, its study's journal, its budget."""

    dists: dict
    journal: str
    trials: int
    seed: int
    sampler: str = "tpe"
    pruner: str = "asha"
    target: float | None = None  # the val loss a trial stops at; the study minimises the seconds to it
    budget_s: float | None = None  # the seconds of training after which a trial stops
    metric: str | None = None  # a command's: the named value of metrics.jsonl the study minimises
    value: str = "last"  # of that metric: its last value, or its best (lowest)


class CommandRecord(_Record):
    """A program of the user's that the sweep's runs start (spec/command.py; node/supervise.py reads it)."""

    argv: list[str]  # with `{key}` placeholders (checked at launch: each has a value)
    project: str  # the snapshot of the user's project: the program's working directory
    stop_signal: str  # the profile's: what the program is sent before the time limit
    heartbeat_s: int | None = None
    max_requeues: int
    start: Literal["tasks", "torchrun"] = "tasks"  # (spec/command.py)
    resume_when: str | None = None  # spec/command.py's resume: once this file exists, a life adds resume_add
    resume_add: list[str] = Field(default_factory=list)
    progress: list[str] = Field(default_factory=list)  # patterns over the program's lines (node/supervise.py)

    def words(self, values: dict[str, Any], resumed: str | None = None) -> list[str]:
        """The words a life of a run starts with: each placeholder given its value, `{{` and `}}` made braces; a
        life that `resumed` from a path (what `resume_file` found) adds resume_add after the others, `{resume}` in
        them that path."""
        given = _words_of(values if resumed is None else {**values, RESUME_VALUE: resumed})
        return [word.format_map(given) if "{" in word or "}" in word else word
                for word in [*self.argv, *(self.resume_add if resumed is not None else [])]]

    def resume_pattern(self, values: dict[str, Any]) -> Path | None:
        """What a life looks for to resume (relative: in the run's directory; a glob takes the newest match), or
        None."""
        return None if self.resume_when is None else Path(values["run_dir"]) / self._when(values)

    def resume_file(self, values: dict[str, Any]) -> Path | None:
        """The file or folder a life resumes from: resume_when's, where it exists; of a glob's matches the last in
        natural order (checkpoint-100 after checkpoint-20: programs number their saves); None: a first life."""
        if self.resume_when is None:
            return None
        when = self._when(values)
        if not glob.has_magic(when):
            return path if (path := Path(values["run_dir"]) / when).exists() else None
        found = glob.glob(os.path.join(glob.escape(values["run_dir"]), when))  # (an absolute `when` stands alone)
        return Path(max(found, key=_natural)) if found else None

    def _when(self, values: dict[str, Any]) -> str:
        return self.resume_when.format_map(_words_of(values))


RESUME_VALUE = "resume"  # in command.resume.add: the path a life resumes from


def _natural(text: str) -> list:
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text)]


def _words_of(values: dict[str, Any]) -> dict[str, str]:
    return {k: word_of(v) for k, v in values.items()}


def word_of(value: Any) -> str:
    """A value as a program's word: numbers as Python writes them, true/false, text as it is."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


class ManifestHead(_Record):
    """A manifest but for its runs: what a new sweep's manifest is written from, with its runs' records beside."""

    # (in the order they are written: a file to read)
    format: int
    name: str
    naming: int = 1  # how its runs are named (layout.NAMING); a manifest without the key is of 1
    spec: str | None = None
    backend: str
    cluster: str | None = None
    workdir: str
    logs_dir: str
    resources: dict
    code: dict
    base: dict
    search: SearchRecord | None = None
    command: CommandRecord | None = None
    retry: dict | None = None  # the retry policy (spec/retry.py), resolved: what its heal job reads
    submissions: list[Submission]

    @property
    def dirs(self) -> SweepDirs:
        return SweepDirs(Path(self.workdir), self.name)


def _with_run_dir(run: Any, runs: Path) -> Any:
    """A run's record with its out_dir where the file leaves it out: its folder in the sweep's runs folder (as
    sweep_runs.py names it: the folder, a slash, the run's name)."""
    if isinstance(run, dict) and isinstance(run.get("name"), str) and "out_dir" not in run:
        return {"out_dir": f"{runs}/{run['name']}", **run}
    return run  # (and the checks say what is wrong, if anything)


def _without_run_dir(run: dict[str, Any], runs: Path) -> dict[str, Any]:
    """`_with_run_dir`'s inverse: the record without its out_dir where that is its folder in the runs folder."""
    if run.get("out_dir") != f"{runs}/{run['name']}":
        return run
    return {k: v for k, v in run.items() if k != "out_dir"}


class Manifest(ManifestHead):
    """A launched sweep as every command after the launch reads it: its runs, the jobs that run them, its
    folders (`dirs`). `load` gives one."""

    runs: list[RunRecord]
    _path: Path = PrivateAttr(default=Path("manifest.json"))

    @model_validator(mode="before")
    @classmethod
    def _run_dirs(cls, data: Any) -> Any:
        """Each run's out_dir where the file leaves it out: its folder under the sweep's runs folder (layout.py)."""
        if not (isinstance(data, dict) and isinstance(data.get("runs"), list) and isinstance(data.get("workdir"), str)
                and isinstance(data.get("name"), str)):
            return data  # (and the checks say what is wrong)
        runs = SweepDirs(Path(data["workdir"]), data["name"]).runs
        return {**data, "runs": [_with_run_dir(run, runs) for run in data["runs"]]}

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        for i, run in enumerate(self.runs):
            if run.index != i:
                raise schema.problem(f"runs[{i}] is not run {i}")
        for i, sub in enumerate(self.submissions):
            if any(not 0 <= index < len(self.runs) for index in sub.indices):
                raise schema.problem(f"submissions[{i}].indices name runs the sweep does not have")
            if sub.per_run_ids is not None and any(str(index) not in sub.per_run_ids for index in sub.indices):
                raise schema.problem(f"submissions[{i}].per_run_ids lack a job of a run it names")
        return self

    @property
    def path(self) -> Path:
        return self._path

    def slurm_submissions(self) -> list[Submission]:
        """The submissions that went to Slurm (not --local runs)."""
        return [s for s in self.submissions if s.to_slurm]

    def first_submitted(self) -> float | None:
        """When the sweep first went to Slurm (the start of its sacct window)."""
        return min((s.submitted_at for s in self.slurm_submissions()), default=None)

    def waiting(self, record: WavesRecord | None = None) -> list[int]:
        """The runs that wait for a wave: in the waves record (`record`, else the sweep's file), named by no
        submission yet."""
        record = record or load_waves(self.dirs)
        if record is None:
            return []
        sent = {index for sub in self.slurm_submissions() for index in sub.indices}
        return sorted({i for s in record.scripts for i in s.indices} - sent)

    def task_job_ids(self) -> dict[int, str]:
        """Run index -> the Slurm id of its newest job (`<array>_<task>` for array tasks)."""
        return {index: sub.task_of(index) for sub in self.slurm_submissions() for index in sub.indices}

    def find(self, which: str) -> list[RunRecord]:
        """The run named `which`, or numbered so."""
        return [r for r in self.runs if r.name == which or str(r.index) == which]


def submissions_record(path: Path) -> Path:
    """The file the submissions of the manifest at `path` are appended to."""
    return Path(path).with_name(SUBMISSIONS)


def create(path: Path, head: ManifestHead, runs: list[dict[str, Any]]) -> None:
    """Write a new sweep's manifest at `path`: its head and its runs' records (fields of RunRecord). The runs are
    written as they are given, not made into typed records first (a sweep may have 100,000 of them); every
    command reads them back as records. An earlier manifest's appended submissions end with it: removed where
    the caller carried every one into `head.submissions` (a crash between the write and the removal leaves each
    twice, which `load` reads once), else set aside, never lost."""
    data = head.model_dump(mode="json", exclude_unset=True)
    _write(Path(path), data, runs)
    record = submissions_record(path)
    try:
        carried = all(json.loads(line) in data["submissions"] for line in record.read_bytes().splitlines())
    except FileNotFoundError:
        return
    except ValueError:
        carried = False
    if carried:
        record.unlink()
    else:
        durable.set_aside(record)


RUNS_START = '\n "runs": [\n'  # where the runs begin in a manifest `_write` wrote: then a line per run


def _write(path: Path, head: dict[str, Any], runs: list[dict[str, Any]]) -> None:
    """Indented, but one line per run: a sweep of 100,000 runs stays a file to read and grep, and an array task
    reads its own line (`load_run`). A run's out_dir is left out where it is its folder in the sweep's runs
    folder (`_with_run_dir` fills that in again)."""
    text = json.dumps(head, indent=1)
    encode = json.JSONEncoder().encode  # (json.dumps's defaults without its cost per call)
    runs_dir = SweepDirs(Path(head["workdir"]), head["name"]).runs
    lines = ",\n".join(f"  {encode(_without_run_dir(run, runs_dir))}" for run in runs)
    durable.write(path, f'{text[:-2]},{RUNS_START}{lines}\n ]\n}}\n')


def _head_of(head_text: str) -> Any:
    """The head of a manifest `_write` wrote, from its text before RUNS_START (which ends with a comma)."""
    return json.loads(head_text.rstrip()[:-1] + "\n}")


def naming(path: Path, new: int) -> int:
    """How the runs of the sweep whose manifest is at `path` are named (its head's `naming`); `new` for a sweep not
    launched yet, or whose manifest cannot be read (launching it says what is wrong with the file)."""
    try:
        text = Path(path).read_text()
        head_text, start, _ = text.partition(RUNS_START)
        head = _head_of(head_text) if start else json.loads(text)
    except (OSError, ValueError):
        return new
    found = head.get("naming", 1) if isinstance(head, dict) else new
    return found if isinstance(found, int) and not isinstance(found, bool) else new


def load_run(path: Path, index: int) -> tuple[ManifestHead, RunRecord]:
    """The manifest's head and run `index`'s record, as an array task needs them: from the head and that run's
    own line where the file is laid out as `_write` writes it (a task of a 100,000-run sweep does not read the
    100,000 records), else from the whole file (`load`, with its messages)."""
    if index < 0:
        raise IndexError(f"run {index}: runs are numbered from 0")
    try:
        head_text, start, runs_text = Path(path).read_text().partition(RUNS_START)
        head = ManifestHead.model_validate(_head_of(head_text))
        line = runs_text.split("\n", index + 1)[index].strip().removesuffix(",")
        run = RunRecord.model_validate(_with_run_dir(json.loads(line), head.dirs.runs))
        if start and head.format == FORMAT and run.index == index:
            return head, run
    except (OSError, ValueError, IndexError):  # (ValueError: ValidationError and JSON's errors too)
        pass
    manifest = load(Path(path))
    return manifest, manifest.runs[index]


def load(path: Path) -> Manifest:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        absent = next(p for p in [*reversed(Path(path).parents), Path(path)] if not os.path.exists(p))
        if absent != Path(path).parent:  # (a folder above the sweep's is missing: a --workdir or name mistyped)
            raise LaunchError(f"{path}: no manifest, as {absent} does not exist; check --workdir (the folder the "
                              f"sweep was launched from) and the spec's name") from None
        raise LaunchError(f"{path}: no manifest; launch the spec first (or with --dry-run)") from None
    except OSError as err:
        raise LaunchError(f"{str(path)[:300]}: the manifest cannot be read ({err.strerror or err}); check --workdir "
                          f"and the spec's name") from None
    except ValueError as err:  # (cut short by a crash or a full disk, or changed by hand)
        raise _damaged(Path(path), f"not JSON: {err}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise LaunchError(f"{path}: manifest format {found!r}, this version reads {FORMAT}; launch the spec again")
    if isinstance(data.get("submissions"), list):  # (else the checks below say what is wrong)
        data["submissions"] += _appended(Path(path), data["submissions"])
    return _checked(Path(path), data)


def _appended(path: Path, own: list) -> list[dict[str, Any]]:
    """The submissions appended beside the manifest at `path`, each checked, in order; those the manifest has
    itself already (carried into a new manifest just before the file was removed) once."""
    record = submissions_record(path)
    try:
        lines = record.read_bytes().splitlines()
    except FileNotFoundError:
        return []
    except OSError as err:
        raise LaunchError(f"{record}: the sweep's submissions cannot be read ({err.strerror or err})") from None
    appended = []
    for number, line in enumerate(lines, 1):
        try:
            data = json.loads(line)
            Submission.model_validate(data)
        except ValidationError as err:
            raise _damaged(record, f"line {number}: {schema.messages(err, Submission)[0]}") from None
        except ValueError as err:  # (not JSON, or not UTF-8: a line cut short by a crash, or changed since)
            raise _damaged(record, f"line {number} is not a record: {err}") from None
        if data not in own:
            appended.append(data)
    return appended


def _damaged(path: Path, problem: str) -> LaunchError:
    what = {"manifest.json": "manifest", "waves.json": "waves record"}.get(path.name, "submissions record")
    return LaunchError(f"{path}: the {what} is damaged "
                       f"({problem}), so the sweep's runs and jobs cannot be read from it; if none of its jobs is "
                       f"queued or running (squeue --me), move it aside (mv {path} {path}.corrupt) and launch the "
                       f"spec again")


def _checked(path: Path, data: dict[str, Any]) -> Manifest:
    """Every key a command reads has the type it is read as, so no command meets a KeyError or a TypeError
    halfway; else the first problem found, with what to do."""
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as err:
        raise _damaged(path, schema.messages(err, Manifest)[0]) from None
    manifest._path = Path(path)
    return manifest


def record_submission(path: Path, backend: str, job_id: str, indices: list[int], **extra: Any) -> None:
    """Append a submission to the record of the manifest at `path`, durably, before anything else is submitted
    (keys not given are not written: a default is not written out)."""
    record = Submission(backend=backend, job_id=job_id, indices=indices, submitted_at=time.time(), **extra)
    durable.append_line(submissions_record(path), json.dumps(record.model_dump(mode="json", exclude_unset=True)))


if __name__ == "__main__":
    # `python -m tinygpt.launch.manifest config MANIFEST INDEX` is how a batch script asked for its run's config
    # file before node/run_config.py took the job; a script that still says so (a resubmission reuses the sweep's
    # own script) gets it.
    import runpy

    runpy.run_module("tinygpt.launch.node.run_config", run_name="__main__")
