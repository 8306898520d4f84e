"""A test that is not about Slurm runs as on a machine without Slurm, cluster up or not (tests/conftest.py); a
test marked `slurm` sees the cluster."""

import os
import shutil
import subprocess
import sys

import pytest

from tests.support.hermetic import SLURM_COMMANDS, SLURM_VARIABLES
from tests.support.paths import ROOT
from tests.support.processes import python_env


def what_is_seen() -> tuple[list[str], list[str], str | None]:
    """(the Slurm commands on PATH, the variables set that steer them but SLURM_CONF, the configuration file)"""
    return (sorted(c for c in SLURM_COMMANDS if shutil.which(c)),
            sorted(n for n in os.environ if n.startswith(SLURM_VARIABLES) and n != "SLURM_CONF"),
            os.environ.get("SLURM_CONF"))


@pytest.fixture(scope="module")
def seen_by_a_module_fixture():
    return what_is_seen()


def test_a_test_not_about_slurm_sees_no_slurm_nor_its_variables(seen_by_a_module_fixture):
    assert what_is_seen() == ([], [], os.devnull)  # (an empty configuration)
    assert seen_by_a_module_fixture == ([], [], os.devnull)  # (set up within the first test that uses it, hidden too)
    assert shutil.which("git") and shutil.which("sh")  # (everything else is still on PATH)


def test_slurm_is_hidden_even_when_the_machine_has_it(tmp_path):
    """The test above, in a pytest of its own on a machine with Slurm's commands on PATH and its variables set:
    it sees neither (and a `slurm` test beside it sees both)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    conf = tmp_path / "elsewhere.conf"  # (a configuration, and a cluster whose one node is idle, to the gate)
    conf.write_text("ClusterName=elsewhere\n")
    for name in ("sinfo", "sbatch", "squeue"):
        (bindir / name).write_text("#!/bin/sh\necho idle\n")
        (bindir / name).chmod(0o755)
    (tmp_path / "test_sees.py").write_text(
        "import shutil, os\nimport pytest\n"
        "def test_unmarked():\n"
        f"    assert shutil.which('sinfo') is None and os.environ['SLURM_CONF'] == {os.devnull!r}\n"
        "@pytest.mark.slurm\n"
        "def test_marked():\n"
        f"    assert shutil.which('sinfo') and os.environ['SLURM_CONF'] == {str(conf)!r}\n")
    env = python_env(PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}", SLURM_CONF=str(conf),
                     SBATCH_PARTITION="debug", TINYGPT_REQUIRE_SLURM="0",
                     PYTHONPATH=str(ROOT))
    env = {k: v for k, v in env.items() if not k.startswith("PYTEST_")}  # (a pytest of its own, not a worker)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                           str(tmp_path / "test_sees.py")], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=120)
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout + done.stderr


@pytest.mark.slurm
@pytest.mark.shares_cluster
def test_a_slurm_test_sees_the_cluster():
    assert "sinfo" in what_is_seen()[0]
