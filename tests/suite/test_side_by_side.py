"""tests/support/side_by_side.py under pytest-xdist's two workers, on a small suite of its own that needs no cluster: a
shared cluster test waits until the exclusive ones have ended, all of them, not just the one running when it asked.

Nothing here waits on a clock: each test of the small suite leaves a file when it starts or ends, and a shared test
another when it asks for the cluster, before it waits; the exclusive tests wait for those files.
"""

import subprocess
import sys

from tests.support.paths import ROOT
from tests.support.processes import python_env

SUITE = '''
import os
import time
from pathlib import Path

import pytest

EVENTS = Path(os.environ["EVENTS"])


def wait_for(pattern):
    deadline = time.monotonic() + 60
    while not list(EVENTS.glob(pattern)):
        assert time.monotonic() < deadline, f"no {pattern} in {sorted(p.name for p in EVENTS.iterdir())}"
        time.sleep(0.01)


@pytest.mark.slurm
def test_exclusive_1():
    (EVENTS / "start-exclusive-1").touch()
    wait_for("asks-shared-*")  # the other worker has come to a shared test while this one holds the cluster
    (EVENTS / "end-exclusive-1").touch()


@pytest.mark.slurm
def test_exclusive_2():
    (EVENTS / "end-exclusive-2").touch()


@pytest.mark.parametrize("n", range(3))
def test_plain(n):
    wait_for("start-exclusive-1")  # (the other worker has the cluster before this worker comes to a shared test)


@pytest.mark.slurm
@pytest.mark.shares_cluster
@pytest.mark.parametrize("n", range(2))
def test_shared(n):
    assert sorted(p.name for p in EVENTS.glob("end-exclusive-*")) == ["end-exclusive-1", "end-exclusive-2"]
'''

CONFTEST = '''
import os
from pathlib import Path

import pytest

pytest_plugins = ["tests.support.side_by_side"]


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # (before side_by_side's, which waits for the cluster)
def pytest_runtest_protocol(item, nextitem):
    if item.get_closest_marker("shares_cluster"):
        (Path(os.environ["EVENTS"]) / f"asks-shared-{item.callspec.id}").touch()
    yield
'''


def test_a_shared_cluster_test_waits_for_every_exclusive_one(tmp_path):
    suite, events = tmp_path / "suite", tmp_path / "events"
    suite.mkdir()
    events.mkdir()
    (suite / "test_small.py").write_text(SUITE)
    (suite / "conftest.py").write_text(CONFTEST)
    (suite / "pytest.ini").write_text("[pytest]\nmarkers =\n    slurm\n    shares_cluster\n    alone\n")
    env = {k: v for k, v in python_env(EVENTS=str(events), PYTHONPATH=str(ROOT)).items()
           if not k.startswith("PYTEST_")}  # (not this run's xdist worker: a run of its own)
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
                           "-q", str(suite)], capture_output=True, text=True, timeout=300, cwd=suite, env=env)
    assert done.returncode == 0 and "7 passed" in done.stdout, done.stdout + done.stderr
    asked = sorted(p.name for p in events.glob("asks-shared-*"))
    assert asked == ["asks-shared-0", "asks-shared-1"]
