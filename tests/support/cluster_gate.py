"""Whether the local cluster (hpc_lab/local_cluster/up.sh) is up, and what it lacks for a test that needs more."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

LOCAL_CLUSTER_HOME = Path(os.environ.get("TINYGPT_SLURM_HOME", "/var/lib/tinygpt-slurm"))  # (up.sh's folder)


def slurm_problem() -> str | None:
    if shutil.which("sinfo") is None:
        return "sinfo is not on PATH (bring a cluster up with: sudo hpc_lab/local_cluster/up.sh)"
    conf = Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))
    if not conf.exists():  # (sinfo would look for a controller in DNS: nothing here asks the network)
        return f"no Slurm configuration at {conf} (bring a cluster up with: sudo hpc_lab/local_cluster/up.sh)"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.SubprocessError) as err:
        return f"sinfo failed: {err}"
    if out.returncode != 0:
        return f"sinfo failed: {out.stderr.strip()}"
    states = out.stdout.split()
    if not any(s.startswith(("idle", "mix", "alloc")) for s in states):
        return f"no usable Slurm node (states: {' '.join(states) or 'none'})"
    return None


def _output(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def cluster_lacks(need: str) -> str | None:
    """Why the cluster lacks what `@pytest.mark.slurm(needs=[...])` asks for, and the up.sh option that gives it
    (CI's cluster has them all)."""
    if need == "gpus":
        gres = _output("sinfo", "-h", "-o", "%G")
        if "gpu:a100:" not in gres or "gpu:h100:" not in gres:
            return "its nodes have no GPUs of types a100 and h100 (up.sh --gpus 2:a100,2:h100)"
    elif need == "accounts":
        enforce = next((line for line in _output("scontrol", "show", "config").splitlines()
                        if line.startswith("AccountingStorageEnforce")), "")
        if "associations" not in enforce or "tinygpt" not in _output("sacctmgr", "-n", "-P", "show", "account"):
            return "it has no accounts and limits enforced (up.sh --accounts)"
    elif need == "login":
        if not (LOCAL_CLUSTER_HOME / "login" / "known_hosts").exists():
            return "it has no login node (up.sh --login)"
    else:
        raise ValueError(f"unknown need {need!r}")
    return None
