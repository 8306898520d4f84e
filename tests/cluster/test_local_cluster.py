"""hpc_lab/local_cluster/up.sh never starts a daemon that would reach an address this machine does not hold."""

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import ROOT

UP = ROOT / "hpc_lab" / "local_cluster" / "up.sh"
# TEST-NET-3 (RFC 5737): documentation only, never routed, held by no interface here.
ELSEWHERE = "203.0.113.7"

# Needs the installed packages (so that up.sh installs nothing) and root for a private mount namespace:
# both hold in CI, where the cluster tests need the same.
pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare"),
]


def test_up_refuses_a_host_name_that_resolves_off_this_machine_and_starts_nothing(tmp_path):
    host = socket.gethostname().split(".")[0]
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n{ELSEWHERE} {host}\n")
    etc_slurm = tmp_path / "etc-slurm"
    etc_slurm.mkdir()
    home = tmp_path / "home"
    # A private mount namespace: this /etc/hosts and /etc/slurm are seen by up.sh alone, never by the
    # cluster the other tests use.
    inner = f"mount --bind {hosts} /etc/hosts && mount --bind {etc_slurm} /etc/slurm && exec bash {UP} --no-accounting"
    out = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", inner],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TINYGPT_SLURM_HOME": str(home)})
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"'{host}' is {ELSEWHERE}, which no interface of this machine holds" in out.stderr
    assert "refusing to start daemons" in out.stderr
    assert "starting" not in out.stdout, out.stdout
    # It wrote its configuration (that is what it checked) and started nothing.
    assert (home / "etc" / "slurm.conf").is_file()
    assert not list((home / "run").iterdir())
    assert Path(os.readlink(etc_slurm / "slurm.conf")) == home / "etc" / "slurm.conf"


@pytest.mark.parametrize("args, message", [
    (["--nodes", "2", "--gpus", "2:a100,2:h100,1"], "--gpus: 3 node specs for 2 node(s); give one for all, or one per"),
    (["--gpus", "two"], "--gpus: 'two' is not N[:TYPE] (e.g. 4 or 4:a100)"),
    (["--gpus", "2:"], "--gpus: '2:' is not N[:TYPE]"),
    (["--accounts", "--no-accounting"], "--accounts needs accounting; drop --no-accounting"),
    (["--slurm", "23.02"], "--slurm: '23.02' is not a release this script brings up; give 22.05 or 24.11"),
    (["--login"], "--login needs --nodes 2 or more (the login node is a network namespace, as the nodes are)"),
])
def test_up_refuses_cluster_options_that_do_not_fit_together_before_touching_anything(tmp_path, args, message):
    home = tmp_path / "home"
    out = subprocess.run(["bash", str(UP), *args], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "TINYGPT_SLURM_HOME": str(home)})
    assert out.returncode == 2 and message in out.stderr, out.stdout + out.stderr
    assert not home.exists()
