"""The local cluster's login node (up.sh --login), as a laptop meets it: OpenSSH's sshd in a namespace of its own,
the user tgstudent and its key only, Slurm's commands there, and the cluster's file system that the laptop does
not have."""

import subprocess
from pathlib import Path

import pytest

from tests.support.cluster_gate import LOCAL_CLUSTER_HOME
from tests.support.slurm import cancel, unique_name, wait

pytestmark = [pytest.mark.slurm(needs=["login"]), pytest.mark.slurm_release, pytest.mark.shares_cluster]

KEYS = LOCAL_CLUSTER_HOME / "login"
USER, HOST = "tgstudent", "login"  # (lib.sh's LOGIN_USER and LOGIN_NAME)


def on_login(command: str, key: Path = KEYS / "id_ed25519", user: str = USER) -> subprocess.CompletedProcess:
    """COMMAND run by the login node's shell, over SSH as a laptop would: never a prompt, the host key checked."""
    return subprocess.run(["ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                           "-o", f"UserKnownHostsFile={KEYS / 'known_hosts'}", "-o", "ConnectTimeout=10",
                           f"{user}@{HOST}", command], capture_output=True, text=True, timeout=60)


def listening_on_ssh_here() -> list[str]:
    """The sockets of this namespace (the laptop's) that listen on port 22, from /proc/net/tcp and tcp6."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            _, local, _, state = line.split()[:4]
            if local.endswith(":0016") and state == "0A":  # (port 22, LISTEN)
                found.append(f"{table}: {local}")
    return found


def test_the_login_node_lets_its_user_in_with_its_key_and_nobody_else(tmp_path):
    shown = on_login("hostname; id -un; sinfo -h -N -o %N | sort -u")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split() == [HOST, USER, "node1", "node2"]  # (its own host; Slurm's commands answer there)

    other = tmp_path / "id_other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True, timeout=30)
    for refused in (on_login("true", key=other), on_login("true", user="root")):
        assert refused.returncode == 255 and "Permission denied (publickey)" in refused.stderr, refused.stderr
    # The laptop runs no sshd of its own: the login node's listens in the login node's namespace only.
    assert listening_on_ssh_here() == []


def test_a_job_from_the_login_node_runs_as_its_user_on_the_file_system_the_laptop_does_not_have():
    name = unique_name("login")
    submitted = on_login(f"cd && sbatch --parsable -J {name} -N 2 -o job-%j.out --wrap 'srun hostname; id -un'")
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()
    try:
        assert wait(job) == "COMPLETED"
    finally:
        cancel(job)
    out = on_login(f"cat job-{job}.out; pwd")
    assert out.returncode == 0, out.stderr
    *lines, home = out.stdout.split()
    assert sorted(lines) == ["node1", "node2", USER] and home == f"/cluster/home/{USER}"
    # On the laptop, the cluster's folder is an empty mount point: a cluster path is not a laptop path.
    assert list(Path("/cluster").iterdir()) == []
