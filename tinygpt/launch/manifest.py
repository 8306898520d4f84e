"""`jobs/<sweep>/manifest.json`: the runs of a sweep, where they live, and the jobs that run them.

Written by the launcher before anything is submitted, updated with job ids after each submission, and
read by every array task on the nodes (`python -m tinygpt.launch.manifest config MANIFEST INDEX` writes the
run's config file from it and prints its path) and by `launch.py status|cancel|report|logs|resubmit`.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tinygpt import durable, schema
from tinygpt.rundir_lock import RunDirLock, describe

from .errors import LaunchError


@dataclass(frozen=True)
class SweepDirs:
    """Where a sweep's files live under its work directory, named here once: jobs/<sweep>/ (the manifest, the
    batch scripts, the code snapshot, the run configs), logs/<sweep>/ (Slurm's logs), runs/<sweep>/<run>/."""

    workdir: Path
    name: str

    @property
    def jobs(self) -> Path:
        return self.workdir / "jobs" / self.name

    @property
    def logs(self) -> Path:
        return self.workdir / "logs" / self.name

    @property
    def runs(self) -> Path:
        return self.workdir / "runs" / self.name

    @property
    def manifest(self) -> Path:
        return self.jobs / "manifest.json"


LOCK_WAIT_S = 5.0  # a second command on the same sweep waits this long for the first, then refuses

FORMAT = 2  # runs keep their trainer inputs (shared ones once, in "base")


def sweep_lock(jobs_dir: Path) -> RunDirLock:
    """One writer per sweep: held (`with sweep_lock(...)`) by every command that writes a sweep's files, submits
    its jobs or records them. The run-directory lock's mechanism, so it holds where flock does not."""
    return RunDirLock(jobs_dir, busy=_sweep_busy, wait_s=LOCK_WAIT_S)


def _sweep_busy(jobs_dir: Path, holder: dict) -> LaunchError:
    return LaunchError(f"sweep `{jobs_dir.name}` is being changed by another launch.py command ({describe(holder)}); "
                       f"nothing was written; run this again once it has ended (or stop it: kill {holder.get('pid')})")


def save(path: Path, manifest: dict[str, Any]) -> None:
    """Indented, but one line per run: a sweep of 10,000 runs stays a file to read and grep."""
    head = json.dumps({k: v for k, v in manifest.items() if k != "runs"}, indent=1, default=str)
    runs = ",\n".join(f"  {json.dumps(run, default=str)}" for run in manifest.get("runs", []))
    durable.write(path, f'{head[:-2]},\n "runs": [\n{runs}\n ]\n}}\n')


def load(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise LaunchError(f"{path}: no manifest; launch the spec first (or with --dry-run)") from None
    except OSError as err:
        raise LaunchError(f"{str(path)[:300]}: the manifest cannot be read ({err.strerror or err}); check --workdir "
                          f"and the spec's name") from None
    except ValueError as err:
        raise LaunchError(f"{path}: not a valid manifest ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise LaunchError(f"{path}: manifest format {found!r}, this version reads {FORMAT}; launch the spec again")
    if problem := damage(manifest):
        raise LaunchError(f"{path}: the manifest is damaged ({problem}), so the sweep's runs and jobs cannot be "
                          f"read from it; if none of its jobs is queued or running (squeue --me), move it aside "
                          f"(mv {path} {path}.corrupt) and launch the spec again")
    return manifest


class _Record(BaseModel):
    """A record of the manifest as a command reads it: each key it reads has the type it is read as (strict:
    a damaged 3 for "3" is damage), and keys it does not read are kept as they are."""

    model_config = ConfigDict(extra="allow", strict=True)


class RunRecord(_Record):
    index: int
    name: str
    out_dir: str
    overrides: dict


class Submission(_Record):
    backend: str
    job_id: str
    submitted_at: float
    indices: list[int]
    offset: int | None = None
    pack: int | None = Field(None, ge=1)
    array: str | None = None
    per_run_ids: dict[str, str] | None = None
    role: str | None = None
    script: str | None = None
    folder: str | None = None


class SearchRecord(_Record):
    dists: dict
    journal: str
    trials: int
    seed: int


class Manifest(_Record):
    name: str
    workdir: str
    logs_dir: str
    backend: str
    base: dict
    code: dict
    resources: dict
    runs: list[RunRecord]
    submissions: list[Submission]
    search: SearchRecord | None = None

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


def damage(manifest: dict[str, Any]) -> str | None:
    """What is wrong with a manifest's shape (the first thing found), or None: every key a command reads has
    the type it is read as, so no command meets a KeyError or a TypeError halfway."""
    try:
        Manifest.model_validate(manifest)
    except ValidationError as err:
        return schema.messages(err, Manifest)[0]
    return None


def config_file(manifest_path: Path, manifest: dict[str, Any], index: int) -> Path:
    """The run's trainer config file, written from the manifest (shared inputs, the run's own, its run
    directory) when the run's task starts."""
    from tinygpt import config as train_config

    run = manifest["runs"][index]
    cfg = train_config.build({**manifest["base"], **run["overrides"], "out_dir": run["out_dir"]})
    path = Path(manifest_path).parent / "configs" / f"{run['name']}.yaml"
    text = train_config.dump_yaml(cfg)
    if not path.is_file() or path.read_bytes() != text.encode():
        durable.write(path, text)
    return path


def record_submission(path: Path, backend: str, job_id: str, indices: list[int], **extra: Any) -> None:
    manifest = load(path)
    manifest.setdefault("submissions", []).append(
        {"backend": backend, "job_id": job_id, "indices": indices, "submitted_at": time.time(), **extra}
    )
    save(path, manifest)


def slurm_submissions(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The submissions that went to Slurm (not --local runs)."""
    return [s for s in manifest.get("submissions", []) if s.get("backend") != "local"]


def first_submitted(manifest: dict[str, Any]) -> float | None:
    """When the sweep first went to Slurm (the start of its sacct window)."""
    return min((s["submitted_at"] for s in slurm_submissions(manifest)), default=None)


def task_job_ids(manifest: dict[str, Any]) -> dict[int, str]:
    """Run index -> the Slurm id of its newest job (`<array>_<task>` for array tasks)."""
    ids: dict[int, str] = {}
    for sub in manifest.get("submissions", []):
        if sub.get("backend") == "local":
            continue
        offset = sub.get("offset", 0)
        for index in sub["indices"]:
            if sub.get("array"):  # (`pack` runs share each task)
                ids[index] = f"{sub['job_id']}_{(index - offset) // sub.get('pack', 1)}"
            else:
                ids[index] = sub["per_run_ids"][str(index)] if "per_run_ids" in sub else sub["job_id"]
    return ids


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3 or argv[0] != "config":
        print("usage: python -m tinygpt.launch.manifest config MANIFEST INDEX", file=sys.stderr)
        return 2
    from tinygpt.config import ConfigError

    try:
        path = config_file(Path(argv[1]), load(Path(argv[1])), int(argv[2]))
    except (LaunchError, IndexError, ValueError, OSError) as err:
        print(f"tinygpt: cannot find run {argv[2]} in {argv[1]}: {err}", file=sys.stderr)
        return 1
    except ConfigError as err:
        print(f"tinygpt: run {argv[2]} of {argv[1]}: {err}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
