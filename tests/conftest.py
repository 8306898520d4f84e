"""Fixtures and hooks: tiny corpora made by the tests, the Slurm gate, hermetic tests (helpers: tests/support/)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

from tests.support import hermetic
from tests.support.cluster_gate import cluster_lacks, slurm_problem
from tests.support.hermetic import SLURM_VARIABLES, path_without_slurm
from tests.support.tiny import TINY_TEXT

pytest_plugins = ["tests.support.side_by_side"]  # which tests run beside which under pytest-xdist

# Property tests draw the same cases on every run and every machine: a run that fails fails again, and one
# that passes did not pass by luck. `pytest --hypothesis-profile hunt` (with TINYGPT_FUZZ_EXAMPLES=N for a
# larger budget) draws fresh random cases by hand, to find what the fixed ones miss. No deadline: a case is
# judged by what it gives, never by how fast a busy machine ran it (Hypothesis's default fails one over 200 ms).
settings.register_profile("repeatable", derandomize=True, database=None, print_blob=True, deadline=None)
settings.register_profile("hunt", derandomize=False, print_blob=True, deadline=None,
                          max_examples=int(os.environ.get("TINYGPT_FUZZ_EXAMPLES", "1000")))
settings.load_profile("repeatable")


@pytest.fixture
def tiny_corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(TINY_TEXT)
    return path


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch) -> Path:
    d = tmp_path / "data"
    monkeypatch.setenv("TINYGPT_DATA_DIR", str(d))
    monkeypatch.setenv("TINYGPT_OFFLINE", "1")
    return d


_SLURM_PROBLEM: dict = {}


def pytest_runtest_setup(item):
    marker = item.get_closest_marker("slurm")
    if marker is None:
        return
    if None not in _SLURM_PROBLEM:
        _SLURM_PROBLEM[None] = slurm_problem()
    problem = _SLURM_PROBLEM[None]
    for need in marker.kwargs.get("needs", ()) if problem is None else ():
        if need not in _SLURM_PROBLEM:
            _SLURM_PROBLEM[need] = cluster_lacks(need)
        problem = problem or _SLURM_PROBLEM[need]
    if problem is None:
        return
    if os.environ.get("TINYGPT_REQUIRE_SLURM") == "1":
        pytest.fail(f"TINYGPT_REQUIRE_SLURM=1 but Slurm is not available: {problem}", pytrace=False)
    pytest.skip(f"Slurm not available: {problem}")


# Hermetic tests (tests/support/hermetic.py): Slurm's commands off PATH, its variables unset, for every test not
# marked `slurm`.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if item.get_closest_marker("slurm") is not None:
        yield
        return
    saved = dict(os.environ)
    for name in [n for n in os.environ if n.startswith(SLURM_VARIABLES)]:
        del os.environ[name]
    os.environ["SLURM_CONF"] = os.devnull  # (an empty configuration, not this machine's /etc/slurm/slurm.conf)
    os.environ["PATH"] = path_without_slurm(os.environ.get("PATH", os.defpath))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def pytest_sessionstart(session):
    hermetic.start_session()
    # Profiles are found in the user's folder too (layout.profile_dirs): every test, and what it starts, sees an
    # empty one of its own rather than this machine's.
    os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="tinygpt-config-")
    os.environ.pop("TINYGPT_CLUSTERS", None)


def pytest_sessionfinish(session):
    hermetic.end_session()
