"""The reading commands on a sweep larger than a screen: status as its runs by state with the failed and running
ones listed (every row with --all), and a report that names the best runs and draws every one. The sweep is
finished_sweep.py's (one run trained, the others written), past both thresholds (SUMMARY_ABOVE, NAMED)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.finished_sweep import make
from tests.support.processes import launch
from tests.support.tiny import TINY_TEXT, train_tiny
from tinygpt import report
from tinygpt.launch.read.run_states import SUMMARY_ABOVE, Row
from tinygpt.launch.status import table as status

RUNS = SUMMARY_ABOVE + 50


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("scale")
    corpus = root / "corpus.txt"
    corpus.write_text(TINY_TEXT)
    trained, _ = train_tiny(root, corpus, "--progress", "off", "--sample-tokens", "40", name="trained")
    return make(root / "w", trained, RUNS)


def test_status_of_a_large_sweep_is_its_runs_by_state_and_all_rows_with_all(finished):
    summary = launch("status", str(finished))  # (piped: the same as on a terminal)
    assert summary.returncode == 0, summary.stderr
    assert f"{RUNS:,} runs: {RUNS:,} FINISHED" in summary.stdout and "--all shows every run" in summary.stdout
    assert "seed=" not in summary.stdout  # (no run is failed or running: none listed)
    every = launch("status", str(finished), "--all")
    assert every.returncode == 0, every.stderr
    assert sum("FINISHED" in line for line in every.stdout.splitlines()) == RUNS


def test_the_summary_lists_the_failed_and_running_runs_only():
    from rich.console import Console

    states = ["FAILED", "RUNNING", "PENDING", "COMPLETED", "HUNG at step 5"]
    rows = [Row(i, f"run{i}", f"7_{i}", states[i % 5], "sacct", 0, 5, 20, None, None, None, None, f"/r/run{i}")
            for i in range(RUNS)]
    console = Console(width=200, record=True)
    console.print(status.view(rows, "sweep s", 200))
    text = console.export_text()
    assert f"{RUNS:,} runs: 30 FAILED, 30 RUNNING, 30 PENDING, 30 COMPLETED, 30 HUNG" in text, text
    listed = {int(word[3:]) for word in text.split() if word.startswith("run") and word[3:].isdigit()}
    assert listed == {i for i in range(RUNS) if i % 5 in (0, 1, 4)}


def test_the_report_of_a_large_sweep_names_the_best_runs(finished):
    done = launch("report", str(finished), timeout=600)
    assert done.returncode == 0, done.stderr
    text = (finished.parent.parent.parent / "runs" / "big" / "report.md").read_text()
    table = [line for line in text.splitlines() if line.startswith("| ") and "`seed=" in line]
    assert len(table) == RUNS and table[0].startswith("| 1 | `seed=1,lr=0.001`")  # (the trained run is best)
    assert f"## Samples of the {report.NAMED} best runs" in text
    assert text.count("### seed=") == report.NAMED
