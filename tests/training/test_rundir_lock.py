"""One owner per run directory: a second trainer refuses, naming the holder; a dead holder never blocks."""

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.support.processes import python_env, wait_until
from tests.support.tiny import TINY_FLAGS, read_metrics
from tinygpt.launch.submit import fork_server
from tinygpt.training import metrics, rundir_lock
from tinygpt.training.rundir_lock import RunDirBusy, RunDirLock

LONG = ["--max-steps", "100000", "--log-interval", "1", "--eval-interval", "100000", "--ckpt-interval", "100000"]


def trainer(corpus, out, data, *extra: str, env: dict | None = None) -> fork_server.Forked:
    """A trainer process (forked warm: tinygpt/launch/submit/fork_server.py)."""
    return fork_server.Forked("tinygpt.train", [*TINY_FLAGS, *LONG, "--data-file", str(corpus), "--out-dir", str(out),
                                                "--data-dir", str(data), *extra], env or python_env())


def wait_training(out, proc: fork_server.Forked | None, steps: int = 3, timeout: float = 120) -> None:
    """Until the run has logged `steps` training lines (failing at once if `proc` ended first)."""
    def training() -> bool:
        log = metrics.of_run(out)
        return log.exists() and sum('"lr"' in line for line in log.read_text().splitlines()) >= steps

    wait_until(training, timeout, poll=0.05, what=f"{steps} training steps", proc=proc)


def test_a_second_trainer_on_a_live_run_directory_refuses_and_names_the_holder(tmp_path, tiny_corpus):
    out = tmp_path / "run"
    first = trainer(tiny_corpus, out, tmp_path / "data", env=python_env(SLURM_JOB_ID="4242"))
    try:
        wait_training(out, first)
        second = fork_server.run("tinygpt.train", [*TINY_FLAGS, "--data-file", str(tiny_corpus), "--out-dir", str(out),
                                                   "--data-dir", str(tmp_path / "data")], python_env(), timeout=120)
        assert second.returncode == 1 and "Traceback" not in second.stderr, second.stderr
        assert f"out_dir: {out} is in use by another trainer (pid {first.pid} on {socket.gethostname()}, " \
               f"Slurm job 4242" in second.stderr
        assert "scancel 4242" in second.stderr and "another --out-dir" in second.stderr
        assert first.poll() is None  # the holder trains on, untouched
    finally:
        first.send_signal(signal.SIGTERM)  # saves and stops
        first.communicate(timeout=120)
    steps = [r["step"] for r in read_metrics(out) if "lr" in r]
    assert steps == list(range(1, len(steps) + 1))  # one writer: every step once
    assert json.loads((out / ".lock").read_text() or "{}") == {}  # released


def test_a_trainer_killed_with_sigkill_does_not_block_the_next_start(tmp_path, tiny_corpus):
    out = tmp_path / "run"
    first = trainer(tiny_corpus, out, tmp_path / "data", "--ckpt-interval", "5")
    wait_training(out, first, steps=7)
    first.kill()
    first.communicate(timeout=60)
    assert json.loads((out / ".lock").read_text())["pid"] == first.pid  # the dead holder's record is still there
    again = fork_server.run("tinygpt.train", [*TINY_FLAGS, "--data-file", str(tiny_corpus), "--out-dir", str(out),
                                              "--data-dir", str(tmp_path / "data"), "--max-steps", "12"], python_env(),
                            timeout=120)
    assert again.returncode == 0, again.stderr
    # It took the lock at once: a holder it had to wait out (STALE_S) would have made it refuse, exit 1.
    assert "resumed from" in again.stdout


def test_the_lock_is_released_and_taken_again_in_one_process(tmp_path):
    with RunDirLock(tmp_path / "r"):
        with pytest.raises(RunDirBusy, match=f"pid {os.getpid()}"):
            RunDirLock(tmp_path / "r").acquire()  # flock conflicts between two open files, also in one process
    with RunDirLock(tmp_path / "r") as lock:
        assert json.loads((tmp_path / "r" / ".lock").read_text())["pid"] == os.getpid()
    assert lock.fd is None


@pytest.fixture
def no_flock(monkeypatch):
    """A filesystem that does not take flock (some cluster filesystems answer ENOLCK)."""
    def refuse(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(rundir_lock.fcntl, "flock", refuse)
    monkeypatch.setattr(rundir_lock, "REFRESH_S", 0.05)


def write_record(folder, **record):
    folder.mkdir(parents=True, exist_ok=True)
    base = {"host": socket.gethostname(), "pid": os.getpid(), "slurm_job": None, "restart": 0, "since": time.time()}
    (folder / ".lock").write_text(json.dumps({**base, **record}))


def test_without_flock_the_holders_record_decides(tmp_path, no_flock, monkeypatch):
    live = tmp_path / "live"
    write_record(live)  # this very process: alive
    with pytest.raises(RunDirBusy):
        RunDirLock(live).acquire()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    write_record(tmp_path / "dead", pid=int(dead.stdout))  # a process of this host that has ended
    RunDirLock(tmp_path / "dead").acquire().release()
    write_record(tmp_path / "elsewhere", host="node-far-away", pid=1)  # another host, refreshed just now
    with pytest.raises(RunDirBusy, match="on node-far-away"):
        RunDirLock(tmp_path / "elsewhere").acquire()
    old = time.time() - rundir_lock.STALE_S - 5
    os.utime(tmp_path / "elsewhere" / ".lock", (old, old))  # ... not refreshed for too long: gone
    RunDirLock(tmp_path / "elsewhere").acquire().release()
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    write_record(tmp_path / "requeued", host="node-far-away", pid=1, slurm_job="77", restart=0)
    RunDirLock(tmp_path / "requeued").acquire().release()  # an older life of this job: Slurm ended it


def test_without_flock_the_holder_keeps_its_record_fresh(tmp_path, no_flock):
    record = tmp_path / "r" / ".lock"
    with RunDirLock(tmp_path / "r"):
        old = time.time() - rundir_lock.STALE_S - 5
        os.utime(record, (old, old))  # as if it had not been refreshed for too long
        wait_until(lambda: os.stat(record).st_mtime > old, 30, poll=0.01, what="the holder's refresher writing "
                   "its record again")
        assert json.loads(record.read_text())["pid"] == os.getpid()  # refreshed, still its own record


@pytest.mark.slurm
@pytest.mark.shares_cluster
def test_two_trainers_on_two_nodes_sharing_a_run_directory_one_refuses(tmp_path, tiny_corpus):
    from tests.support.slurm import cancel, job_env, python, sbatch, unique_name, wait

    out = tmp_path / "shared-run"
    flags = " ".join([*TINY_FLAGS, *LONG, "--data-file", str(tiny_corpus), "--out-dir", str(out), "--data-dir",
                      str(tmp_path / "data")])
    script = f"#!/bin/bash\nsrun {python()} -m tinygpt.train {flags}\n"
    first = sbatch("-J", unique_name("lock1"), "-w", "node1", "-o", str(tmp_path / "first.out"), script=script,
                   env=job_env())
    try:
        wait_training(out, None, timeout=180)
        second = sbatch("-J", unique_name("lock2"), "-w", "node2", "-o", str(tmp_path / "second.out"), script=script,
                        env=job_env())
        assert wait(second, timeout=180) == "FAILED"
    finally:
        cancel(first)
    log = (tmp_path / "second.out").read_text()
    assert "is in use by another trainer (pid" in log and f"on node1, Slurm job {first}" in log, log
    assert "Traceback" not in log
    steps = [r["step"] for r in read_metrics(out) if "lr" in r]
    assert steps == list(range(1, len(steps) + 1))  # only the first trainer wrote
