"""Which tests run beside which under pytest-xdist (`make test` runs three workers); a plugin tests/conftest.py loads.

The cluster tests (marked `slurm`) have the local cluster to themselves unless they are marked `shares_cluster`:
they run one after another on one worker (one xdist group), each as it would alone, and a shared cluster test
waits until the last of them has ended; shared ones then run side by side on both workers (sent out last, after
the tests that need no cluster). A test may share the cluster when its jobs may wait for CPUs another test's jobs
hold: it asks for no whole node, preempts, stops, crashes or reconfigures nothing, and reads only its own jobs.

The tests of a module that makes a fixture once for the module (not a cluster test) run on one worker, so that
it is made once.

Independently of the cluster, a test marked `alone` measures how its jobs use their CPUs: it waits until the test
beside it has ended, and nothing starts beside it until it is done.

The cluster's rule and `alone` are readers-writer locks between the workers, on files in the run's own folder
(the one that holds each worker's temporary folder, popen-gwN, and goes with them). Without xdist every test is
alone already.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

GROUP = "slurm"  # the xdist group of the cluster tests that have the cluster to themselves


def cluster_use(item: pytest.Item) -> str | None:
    """'exclusive' or 'shared' for a cluster test, None for a test that needs no cluster."""
    if item.get_closest_marker("slurm") is None:
        return None
    return "shared" if item.get_closest_marker("shares_cluster") is not None else "exclusive"


class WorkersLock:
    """A readers-writer lock between the workers (flock), fair to a writer: `gate` keeps a waiting writer from
    being overtaken by readers that ask after it."""

    def __init__(self, name: str):
        self.name = name
        self.files = None

    def acquire(self, config: pytest.Config, exclusive: bool) -> None:
        folder = Path(config.option.basetemp).parent  # (xdist gives each worker basetemp=<the run's>/popen-gwN)
        gate, lock = (open(folder / f"{self.name}.{part}", "a") for part in ("gate", "lock"))
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        if not exclusive:
            fcntl.flock(gate, fcntl.LOCK_UN)
        self.files = (gate, lock)

    def release(self) -> None:
        if self.files is not None:
            for f in reversed(self.files):
                f.close()  # (closing the last descriptor of a file unlocks it)
            self.files = None


CLUSTER, CORES = WorkersLock("cluster"), WorkersLock("cores")


def _side_by_side(config: pytest.Config) -> bool:
    return os.environ.get("PYTEST_XDIST_TESTRUNUID") is not None and config.option.basetemp is not None


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups to send each to one worker
def pytest_collection_modifyitems(config, items):
    for item in items:
        if cluster_use(item) == "exclusive":
            item.add_marker(pytest.mark.xdist_group(GROUP))
        elif cluster_use(item) is None and _module_fixture(item):  # (made once, not once on each worker)
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
        elif item.get_closest_marker("slurm_release") is not None and cluster_use(item) is None:
            raise pytest.UsageError(f"{item.nodeid} is marked slurm_release but not slurm; mark it slurm too")
    # `alone` tests first: then the test beside one is the other worker's first, not a long one half done. Shared
    # cluster tests last: sent out earlier, they would wait on the exclusive ones while other tests could run.
    items.sort(key=lambda item: (item.get_closest_marker("alone") is None, cluster_use(item) == "shared"))


def _module_fixture(item: pytest.Item) -> bool:
    """Whether the test uses a fixture made once for its module (a module of cases run up front, a sweep run once):
    its module's tests then go to one worker. Cluster tests are left spread, each worker's laptop its own."""
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(defs[-1].scope == "module" for defs in info.name2fixturedefs.values())


def pytest_collection_finish(session):
    """On a worker of `--dist loadgroup`: the exclusive cluster tests really are one group (a pytest-xdist that
    stops grouping says nothing, and they would run side by side)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None or not session.config.getvalue("loadgroup"):
        return
    lost = [item.nodeid for item in session.items
            if cluster_use(item) == "exclusive" and not item.nodeid.endswith(f"@{GROUP}")]
    if lost:
        raise pytest.UsageError(f"pytest-xdist did not group the cluster tests (e.g. {lost[0]}); this pytest and "
                                f"pytest-xdist do not work together (pytest-dev/pytest-xdist#1386): pip install "
                                f"-e '.[dev]' installs a pair that does")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """The cluster, for the whole of a test: its module's fixtures too, which the protocol sets up and tears down."""
    use = cluster_use(item) if _side_by_side(item.config) else None
    if use is not None and CLUSTER.files is None:
        CLUSTER.acquire(item.config, exclusive=use == "exclusive")
    try:
        yield
    finally:
        # Kept from one exclusive test to the next: a shared test let in between would make the rest wait on it.
        if not (use == "exclusive" and nextitem is not None and cluster_use(nextitem) == "exclusive"):
            CLUSTER.release()


@pytest.fixture(autouse=True)
def _share_of_the_machine(request):
    if not _side_by_side(request.config):
        yield
        return
    CORES.acquire(request.config, exclusive=request.node.get_closest_marker("alone") is not None)
    try:
        yield
    finally:
        CORES.release()
