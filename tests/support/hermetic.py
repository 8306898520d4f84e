"""Hermetic tests: a test that is not marked `slurm` runs as on a machine without Slurm, whether or not a cluster
is up, so that it gives the same answer in CI and on a newcomer's laptop. For its whole protocol (setup, call,
teardown: the module-scoped fixtures it sets up too), Slurm's commands are off PATH, the variables that steer
them are unset and its configuration is empty (tests/conftest.py's hooks); a `slurm` test sees the cluster.
Stand-ins for Slurm's commands that record what they were asked, for the tests of what asks nothing.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
from pathlib import Path

SLURM_COMMANDS = frozenset({"sacct", "sacctmgr", "salloc", "sattach", "sbatch", "sbcast", "scancel", "scontrol",
                            "scrontab", "sdiag", "sh5util", "sinfo", "sprio", "squeue", "sreport", "srun", "sshare",
                            "sstat", "strigger", "sview"})

SLURM_VARIABLES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SACCT_", "SINFO_", "SCONTROL_")

_WITHOUT_SLURM: dict[str, str] = {}  # {PATH folder that holds a Slurm command: the same folder without them}

_SESSION_FOLDER = ""  # the session's own folder (start_session), removed with all it holds at its end


def start_session() -> None:
    """What the tests' processes would keep in the user's folders goes to a folder of this run's instead: data
    prepared without a folder named for it (the trainer's default, $TINYGPT_DATA_DIR, else ./data: the
    checkout), W&B's debug logs and settings (~/.cache/wandb, ~/.config/wandb), the trainer's bf16 probe
    (~/.cache/tinygpt); PATH's mirrors too."""
    global _SESSION_FOLDER
    _SESSION_FOLDER = tempfile.mkdtemp(prefix="tinygpt-tests-")
    for name, sub in (("TINYGPT_DATA_DIR", "data"), ("WANDB_CACHE_DIR", "wandb-cache"),
                      ("WANDB_CONFIG_DIR", "wandb-config"), ("XDG_CACHE_HOME", "cache")):
        os.environ[name] = os.path.join(_SESSION_FOLDER, sub)


def end_session() -> None:
    shutil.rmtree(_SESSION_FOLDER, ignore_errors=True)


def path_without_slurm(path: str) -> str:
    """PATH with each folder that holds a Slurm command replaced by a copy of it (links) that does not."""
    folders = []
    for folder in path.split(os.pathsep):
        if folder not in _WITHOUT_SLURM:
            _WITHOUT_SLURM[folder] = folder
            try:
                names = set(os.listdir(folder)) if folder else set()
            except OSError:
                names = set()
            if names & SLURM_COMMANDS:
                mirror = Path(tempfile.mkdtemp(prefix="path-without-slurm-", dir=_SESSION_FOLDER or None))
                for name in names - SLURM_COMMANDS:
                    (mirror / name).symlink_to(Path(folder) / name)
                _WITHOUT_SLURM[folder] = str(mirror)
        folders.append(_WITHOUT_SLURM[folder])
    return os.pathsep.join(folders)


def slurm_that_records(folder: Path) -> tuple[dict[str, str], Path]:
    """Stand-ins for every Slurm command, each writing its command line to a log and failing as a controller
    that does not answer: (the environment that puts them on PATH, the log). The log stays absent while
    nothing asks Slurm anything."""
    bindir, log = folder / "slurm-that-records", folder / "slurm-asked.log"
    bindir.mkdir(parents=True)
    for name in SLURM_COMMANDS:
        (bindir / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {shlex.quote(str(log))}\n'
                                   f'echo "{name}: error: Unable to contact slurm controller (connect failure)" >&2\n'
                                   f'exit 1\n')
        (bindir / name).chmod(0o755)
    return {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}, log
