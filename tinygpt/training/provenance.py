"""Where a run came from: code version, software, hosts, Slurm ids and the exact command line.

Each start of a run (the first, and every resume after a requeue) appends one record to
`<out_dir>/provenance.json`, so a run that lived through three jobs on two clusters says so.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import tinygpt
from tinygpt.base import durable

REPO = Path(tinygpt.__file__).resolve().parents[1]  # the folder that holds the package: a checkout or a snapshot
SLURM_KEYS = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_RESTART_COUNT",
              "SLURM_JOB_NODELIST", "SLURM_JOB_PARTITION", "SLURM_CLUSTER_NAME", "SLURM_NTASKS",
              "SLURM_JOB_ACCOUNT", "SLURM_GPUS_ON_NODE")


def _run(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state() -> dict:
    """The code's commit and whether it had uncommitted changes; for code run from a launcher's snapshot
    (tinygpt/launch/submit/snapshot.py), what the snapshot recorded when it was taken, and its digest."""
    try:
        snap = json.loads((REPO / "SNAPSHOT.json").read_bytes())
        snap = snap if isinstance(snap, dict) else {}
        return {"commit": snap.get("commit"), "dirty": snap.get("dirty"), "snapshot": snap.get("digest"),
                "snapshot_path": str(REPO)}
    except (OSError, ValueError):
        pass
    if shutil.which("git") is None:
        return {"commit": None, "dirty": None}
    commit = _run(["git", "-C", str(REPO), "rev-parse", "HEAD"])
    status = _run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"])
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def gpu_names() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    out = _run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
    return [line.strip() for line in out.splitlines() if line.strip()] if out else []


def slurm_release() -> str | None:
    """The release of the Slurm this job runs under ("slurm-wlm 24.11.5"), or None outside a job."""
    return _run(["scontrol", "--version"]) if "SLURM_JOB_ID" in os.environ else None


def placement() -> dict:
    """Where this rank runs and what it was given: its host, Slurm's CPUs per task (None outside Slurm), the CPUs
    it may run on (its affinity set), and torch's threads."""
    import torch

    cpus_per_task = os.environ.get("SLURM_CPUS_PER_TASK", "")
    return {"host": socket.gethostname(), "cpus_per_task": int(cpus_per_task) if cpus_per_task.isdigit() else None,
            "cpus": len(os.sched_getaffinity(0)), "threads": torch.get_num_threads()}


def collect(hostnames: list[str], world_size: int, device: str) -> dict:
    import torch

    nccl = None
    if torch.cuda.is_available():
        try:
            nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001 (builds without NCCL)
            nccl = None
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": list(getattr(sys, "orig_argv", [sys.executable, *sys.argv])),
        "cwd": os.getcwd(),
        "git": git_state(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "device": device,
        "gpus": gpu_names(),
        # The GPUs this process may use, as Slurm (and, for a packed run, its share) left them: the count is
        # right on a cluster whose GPUs have no driver here, too.
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "hostnames": hostnames,
        "world_size": world_size,
        "slurm": {k: os.environ[k] for k in SLURM_KEYS if k in os.environ},
        "slurm_release": slurm_release(),
    }


def append(out_dir: Path, record: dict, fresh: bool = False) -> None:
    """Add this start's record; a fresh run (no checkpoint to resume) starts the list anew."""
    path = Path(out_dir) / "provenance.json"
    data = {"starts": []}
    if not fresh and path.exists():
        try:
            data = json.loads(path.read_bytes())
        except ValueError:
            data = None
        if not isinstance(data, dict) or not isinstance(data.get("starts"), list):
            durable.set_aside(path)  # kept for a reader, never deleted
            data = {"starts": []}
    data["starts"].append(record)
    durable.write(path, json.dumps(data, indent=1) + "\n")
