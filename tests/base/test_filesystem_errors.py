"""The filesystem's own refusals (a full disk, a read-only one) become one plain message naming the path
and the cause, in the trainer, the report and the launcher; a full disk never costs the newest checkpoint.

A real filesystem says no here: a small tmpfs of our own, filled up or remounted read-only (mounting one
needs root, which CI has)."""

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT
from tests.support.processes import launch as shared_launch
from tests.support.processes import python_env
from tests.support.tiny import TINY_FLAGS, read_metrics, tiny_train
from tinygpt.launch.submit import fork_server
from tinygpt.training import checkpoint


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0 and not os.environ.get("CI"):
        pytest.skip("mounting a tmpfs needs root (CI runs this as root)")
    where = tmp_path / "disk"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(where)], check=True)
    yield where
    subprocess.run(["umount", "-l", str(where)], check=True)


def fill(disk: Path, leave: int) -> Path:
    """Take the free space of `disk` but `leave` bytes: room for the metrics' lines, not for a checkpoint."""
    filler = disk / "filler"
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    filler.write_bytes(b"\0" * (free - leave))
    return filler


def train(out_dir: Path, corpus: Path, max_steps: int) -> subprocess.CompletedProcess:
    """A trainer process (forked warm: tinygpt/launch/submit/fork_server.py) to its end."""
    return fork_server.run("tinygpt.train", [*TINY_FLAGS, "--data-file", str(corpus), "--out-dir", str(out_dir),
                                             "--max-steps", str(max_steps)], python_env(), cwd=ROOT)


def test_a_full_disk_stops_the_trainer_with_one_message_and_keeps_the_newest_checkpoint(small_disk, tiny_corpus):
    run = small_disk / "run"
    assert train(run, tiny_corpus, 10).returncode == 0
    filler = fill(small_disk, leave=64 * 1024)  # (a checkpoint of the tiny model is ~200 kB)
    out = train(run, tiny_corpus, 30)  # its checkpoint at step 20 finds no space
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"error: cannot go on: out_dir: {run}/checkpoints/step_00000020.pt: no space left on the device; free " \
           f"space on it; then run the same command again" in out.stderr, out.stderr
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_00000010.pt"]  # no half-written file
    assert checkpoint.load(run / "checkpoints" / "step_00000010.pt").step == 10
    filler.unlink()
    again = train(run, tiny_corpus, 30)
    assert again.returncode == 0, again.stderr
    starts = [r["step"] for r in read_metrics(run) if r.get("event") == "start"]
    assert starts == [0, 10, 10] and read_metrics(run)[-1]["event"] == "finished"


def test_a_read_only_filesystem_is_named_by_the_trainer_the_report_and_the_launcher(small_disk, tiny_corpus,
                                                                                    tmp_path):
    spec = tmp_path / "ro.yaml"
    spec.write_text(yaml.safe_dump({"name": "ro", "train": tiny_train(max_steps=10, eval_interval=5,
                                                                     data_file=str(tiny_corpus))}))

    def launch(*args: str) -> subprocess.CompletedProcess:
        return shared_launch(*args, "--workdir", str(small_disk), timeout=300)

    assert launch(str(spec), "--local").returncode == 0
    run = small_disk / "runs" / "ro" / "base"
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    out = train(run, tiny_corpus, 20)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert f"error: cannot go on: out_dir: {run}/.lock: the filesystem is read-only; use a directory on a writable " \
           f"filesystem" in out.stderr, out.stderr
    report = launch("report", str(spec))
    assert report.returncode == 1 and "Traceback" not in report.stderr
    assert f"{small_disk}/runs/ro/" in report.stderr and "the filesystem is read-only" in report.stderr, report.stderr
    again = launch(str(spec), "--dry-run")
    assert again.returncode == 1 and "Traceback" not in again.stderr
    assert "is not writable); give a directory you can write to" in again.stderr, again.stderr
