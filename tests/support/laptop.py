"""The laptop's side of the tests against the local cluster's login node (up.sh --login): a profile for one of
its users, `launch.py` run as on a laptop (Slurm's commands off PATH, its own wheel cache), specs, and what the
cluster itself knows (the tests see Slurm and the cluster's file system; the laptop does not)."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from tests.support.cluster_gate import LOCAL_CLUSTER_HOME
from tests.support.hermetic import path_without_slurm
from tests.support.paths import ROOT
from tests.support.processes import python_env, wait_until
from tinygpt.launch.remote import private_folders

KEYS = LOCAL_CLUSTER_HOME / "login"
REMOTE_DIR = "tinygpt-hpc-tests"  # in the user's home on the cluster: the README's commands use tinygpt-hpc


def home_there(user: str) -> Path:
    """The user's home on the cluster's file system, seen from this machine (only to set up and to look)."""
    return LOCAL_CLUSTER_HOME / "cluster" / "home" / user


def laptop_for(user: str, here: Path, remote_dir: str = REMOTE_DIR, **login: object) -> dict:
    """The profile the laptop uses to reach the login node as `user` (local-login.yaml, in `here`), the jobs'
    Python put on the cluster once (login.sh python), and the laptop's environment: no Slurm, its own cache."""
    profile = yaml.safe_load((ROOT / "hpc_lab" / "clusters" / "local-login.yaml").read_text())
    profile["login"].update(user=user, remote_dir=remote_dir, **login)
    (here / "local-login.yaml").write_text(yaml.safe_dump(profile))
    jobs_python()
    # (its own SSH connection too: a test that ends its connection ends no other test's commands)
    env = {"PATH": path_without_slurm(os.environ["PATH"]), "SLURM_CONF": os.devnull,
           "XDG_CACHE_HOME": str(here / "cache"), private_folders.ENV: tempfile.mkdtemp(prefix="tgssh-", dir="/tmp")}
    return {"profile": here / "local-login.yaml", "env": env, "dir": here, "user": user,
            "there": home_there(user) / remote_dir}


def jobs_python() -> None:
    """The jobs' Python on the cluster's file system (login.sh python), made once for every test that needs it:
    under a lock, as tests on two workers may ask at once, and never again while jobs may be running it."""
    sw = LOCAL_CLUSTER_HOME / "cluster" / "sw"
    sw.mkdir(parents=True, exist_ok=True)
    with open(sw / ".tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (sw / "python" / "bin" / "python").exists():
            return
        done = subprocess.run(["bash", str(ROOT / "hpc_lab" / "local_cluster" / "login.sh"), "python", sys.prefix],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr


def on_laptop(laptop: dict, *args: str, cwd: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "launch.py"), *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=python_env(COLUMNS="250", **{**laptop["env"], **env}))


def write_spec(folder: Path, name: str, grid: list[float] = (0.001, 0.002), **extra) -> Path:
    spec = {"name": name, "train": {"dataset": "pydoc", "max_steps": 12, "n_layer": 1, "n_head": 2, "n_embd": 32,
                                    "block_size": 32, "batch_size": 8, "eval_interval": 6},
            "grid": {"lr": list(grid)}, **extra}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def jobs_named(name: str) -> list[str]:
    """What the cluster's accounting knows of jobs of that name."""
    out = subprocess.run(["sacct", "-X", "-n", "-P", "--name", name, "-o", "JobID", "-S", "now-1hour"],
                         capture_output=True, text=True, timeout=60)
    return out.stdout.split()


def on_login(user: str, command: str) -> subprocess.CompletedProcess:
    """COMMAND run by `user`'s login shell on the login node, over SSH as a laptop would."""
    return subprocess.run(["ssh", "-i", str(KEYS / "id_ed25519"), "-o", "BatchMode=yes", "-o",
                           "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={KEYS / 'known_hosts'}",
                           "-o", "ConnectTimeout=10", f"{user}@login", command],
                          capture_output=True, text=True, timeout=60)


def watch_interrupted_then_cancelled(laptop: dict, spec: Path, args: list[str], cwd: Path) -> None:
    """`status --watch` of a held sweep, from the laptop: Ctrl-C there ends the watch on the login node (130);
    then `cancel` from the laptop ends the sweep."""
    commands = laptop["there"] / "commands"
    before = set(commands.iterdir())
    watch = subprocess.Popen([sys.executable, str(ROOT / "launch.py"), "status", str(spec), "--watch", *args],
                             cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=python_env(COLUMNS="250", **laptop["env"]))
    try:  # (piped, not a terminal, the watch shows its table when it ends: wait for the command there instead)
        started = wait_until(lambda: [c for c in set(commands.iterdir()) - before if (c / "keeper").exists()],
                             timeout=120, what="the watch started on the login node")
        watch.send_signal(signal.SIGINT)
        assert watch.wait(timeout=60) == 130, watch.stderr.read()
    finally:
        watch.kill()
    # (the watch there ended: Ctrl-C reached it; its keeper writes the status a moment after the laptop hears)
    status = wait_until(lambda: (started[0] / "status").exists() and (started[0] / "status").read_text(),
                        timeout=60, what="the watch's status on the login node")
    assert status == "130", status
    assert "PENDING" in on_laptop(laptop, "status", str(spec), *args, cwd=cwd).stdout

    cancelled = on_laptop(laptop, "cancel", str(spec), *args, cwd=cwd)
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout, cancelled.stderr
    wait_until(lambda: "CANCELLED" in on_laptop(laptop, "status", str(spec), *args, cwd=cwd).stdout,
               timeout=60, what="the sweep shown cancelled from the laptop")
