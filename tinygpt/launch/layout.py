"""Where a sweep's files live and what they are called: named here once, for the commands that write them, the
commands that read them, and the tests.

    <workdir>/jobs/<sweep>/manifest.json            the runs and the jobs that run them (manifest.py)
    <workdir>/jobs/<sweep>/submissions.jsonl        the jobs submitted since, a line each (manifest.py)
    <workdir>/jobs/<sweep>/configs/<run>.yaml       a run's trainer config, written when its task starts
    <workdir>/jobs/<sweep>/<sweep>[-partN].sbatch   the job array (split in parts at MaxArraySize)
    <workdir>/jobs/<sweep>/<sweep>-<step>.sbatch    a chain's data and report steps
    <workdir>/jobs/<sweep>/code/<digest>/           the code the jobs run (snapshot.py)
    <workdir>/jobs/<sweep>/optuna.journal           an Optuna search's study
    <workdir>/logs/<sweep>/<array>_<task>.out       Slurm's log of an array task, every life of it appended
    <workdir>/logs/<sweep>/<array>_<task>.run<i>.out  a packed run's own log
    <workdir>/logs/<sweep>/<step>-<job>.out         a chain step's log
    <workdir>/logs/<sweep>/submitit/                submitit's folder: its pickles and its logs
    <workdir>/runs/<sweep>/<run>/                   what the trainer writes (metrics.jsonl, checkpoints)
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import tinygpt

# The folder that holds the package: this checkout, or an installation's site-packages. What jobs import without
# a snapshot, and what a snapshot is taken of (submit/snapshot.py: git's files, or the package's).
REPO_ROOT = Path(tinygpt.__file__).resolve().parents[1]
CHECKOUT = REPO_ROOT if (REPO_ROOT / "launch.py").is_file() and (REPO_ROOT / "hpc_lab").is_dir() else None
PROFILES_ENV = "TINYGPT_CLUSTERS"  # folders of profiles of the user's, before the others (os.pathsep between)
SUBMISSIONS = "submissions.jsonl"  # beside a sweep's manifest: its submissions, appended
REMOTE_RECORD = "remote.json"  # on a laptop, where the manifest of a sweep launched over SSH would be (remote/)


def user_profile_dir() -> Path:
    """The user's own profiles: $XDG_CONFIG_HOME/tinygpt-hpc/clusters (~/.config/tinygpt-hpc/clusters)."""
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config) / "tinygpt-hpc" / "clusters"


def profile_dirs() -> list[Path]:
    """Where `--cluster NAME` looks for NAME.yaml, in this order: the folders of $TINYGPT_CLUSTERS, the user's
    folder, and this checkout's hpc_lab/clusters (the examples and the local cluster)."""
    named = [Path(p).expanduser() for p in os.environ.get(PROFILES_ENV, "").split(os.pathsep) if p]
    return [*named, user_profile_dir(), *([CHECKOUT / "hpc_lab" / "clusters"] if CHECKOUT else [])]


def schema_file(kind: str) -> Path | None:
    """The JSON Schema of a spec or a profile (`kind`), as this checkout ships it for editors (None when installed
    without one: `schema KIND` prints it)."""
    return CHECKOUT / "schemas" / f"{kind}.schema.json" if CHECKOUT else None


# Slurm's --output pattern of an array task, and the name a task's log then has.
TASK_LOG_PATTERN = "%A_%a.out"
PACKED_RUN_LOG = "{task}.run{index}.out"  # (`task`: the task's id, `<array>_<task>`; `index`: the run's)
STEP_LOG_PATTERN = "{step}-%j.out"


@dataclass(frozen=True)
class SweepDirs:
    """A sweep's folders and files under its work directory."""

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

    @property
    def submissions(self) -> Path:
        return self.jobs / SUBMISSIONS

    @property
    def journal(self) -> Path:
        return self.jobs / "optuna.journal"

    @property
    def code(self) -> Path:
        return self.jobs / "code"

    @property
    def submitit(self) -> Path:
        return submitit_folder(self.logs)

    def run(self, run_name: str) -> Path:
        return self.runs / run_name

    def config(self, run_name: str) -> Path:
        return self.jobs / "configs" / f"{run_name}.yaml"

    def script(self, part: int = 0, parts: int = 1, launch: int = 1) -> Path:
        """The job array's batch script (`part` of `parts`, from 0, when it is split), of the sweep's `launch`th
        launch that submitted runs (a relaunch's new runs have scripts of their own)."""
        stem = self.name if launch == 1 else f"{self.name}-launch{launch}"
        return self.jobs / (f"{stem}-part{part + 1}.sbatch" if parts > 1 else f"{stem}.sbatch")

    def step_script(self, step: str) -> Path:
        return self.jobs / f"{self.name}-{step}.sbatch"

    @property
    def summary(self) -> Path:
        """What its retry policy's last round left (heal/heal_pass.py), beside the sweep's report."""
        return self.runs / "summary.md"

    @property
    def waves(self) -> Path:
        """A sweep larger than the queue limits let out at once: its runs that wait for a wave (heal/waves.py)."""
        return self.jobs / "waves.json"

    @property
    def cancelled(self) -> Path:
        """Present once `cancel` has cancelled the sweep: its heal job sends nothing more."""
        return self.jobs / "cancelled"


def task_log(logs_dir: Path, task: str) -> Path:
    """The log of array task `task` (`<array>_<task>`), or of a single job."""
    return Path(logs_dir) / TASK_LOG_PATTERN.replace("%A_%a", task)


def packed_run_log(logs_dir: Path, task: str, index: int) -> Path:
    return Path(logs_dir) / PACKED_RUN_LOG.format(task=task, index=index)


def submitit_folder(logs_dir: Path) -> Path:
    """The folder submitit keeps a sweep's pickled tasks and its logs in."""
    return Path(logs_dir) / "submitit"


def submitit_logs(folder: Path, job_id: str) -> list[Path]:
    """submitit's two logs of a job, in its folder (its own naming)."""
    return [Path(folder) / f"{job_id}_0_log.out", Path(folder) / f"{job_id}_0_log.err"]


# ----------------------------------------------------------------------------------------------------
# Names and folders: a sweep's and a run's name become file, folder and job names.

SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=,+-]{0,119}")


# How a sweep's runs are named, as its manifest records it (`naming`; a manifest without one is of naming 1):
#   1  lr=0.001,seed=1   (before: a run directory that breaks every `--key=value` configurator it is handed to,
#                         nanoGPT's, Hydra's overrides, which split a word on `=` or `,`)
#   2  lr-0.001_seed-1   (letters, digits and . _ + - alone; a value holding anything else is written with those
#                         and a short hash of what it was, so that two values never share a name)
# A sweep keeps the naming it was launched with: a relaunch, a resubmit and status find its runs where they are.
NAMING = 2


def pair(key: str, text: str, naming: int = NAMING) -> str:
    """One part of a run's name: a key and its value's text (`lr-0.001`; naming 1: `lr=0.001`)."""
    return f"{key}={text}" if naming == 1 else f"{key}-{text}"


def joined(parts: list[str], naming: int = NAMING) -> str:
    """A run's name from its parts (`lr-0.001_seed-1`; naming 1: `lr=0.001,seed=1`)."""
    return ("," if naming == 1 else "_").join(parts)


def name_problem(value: str) -> str | None:
    """Why `value` cannot name a sweep or a run (a file, folder and job name), or None."""
    if not SAFE_NAME.fullmatch(value) or ".." in value:
        return (f"{value!r} cannot be used as a file or job name; use letters, digits and . _ = , + - (starting "
                f"with a letter or digit, at most 120 characters, no '..')")
    return None


def check_safe_name(value: str, field_name: str, problems: list[str]) -> bool:
    if why := name_problem(value):
        problems.append(f"{field_name}: {why}")
        return False
    return True


def unwritable_dir(where: Path, probe: bool = False) -> str | None:
    """Why a directory (made with its parents where missing) could not be written in, or None. `probe`: also make
    and remove a folder there (permission bits do not stop root, and /proc or a read-only mount refuse what
    os.access allows); without it such a folder is found when the data is prepared, with the spec's other
    problems."""
    if any(len(part.encode()) > 255 for part in where.parts) or len(str(where).encode()) > 3000:
        return "a name in it is too long"
    existing = where
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    if probe:
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".tinygpt-probe-", dir=existing))
        except OSError as err:
            return f"{existing} takes no new folder ({err.strerror})"
    return None
