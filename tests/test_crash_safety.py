"""Kills and signals on one machine: checkpoints stay complete, runs resume exactly, requeue has a fallback."""

import json
import random
import signal
import subprocess
import sys
import time

import pytest

from conftest import TINY_FLAGS, loss_series, python_env, read_metrics
from tinygpt import checkpoint as ckpt

CRASH_FLAGS = [*TINY_FLAGS, "--max-steps", "800", "--ckpt-interval", "4", "--keep-checkpoints", "2",
               "--log-interval", "1", "--eval-interval", "25", "--dropout", "0.1"]


def trainer(corpus, out, data_dir, *extra):
    return [sys.executable, "-m", "tinygpt.train", *CRASH_FLAGS, "--data-file", str(corpus), "--out-dir", str(out),
            "--data-dir", str(data_dir), *extra]


def last_logged_step(out) -> int:
    try:
        lines = (out / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return -1
    steps = []
    for line in lines:
        try:
            steps.append(json.loads(line).get("step", -1))
        except ValueError:
            pass
    return max(steps, default=-1)


def test_sigkill_at_random_moments_leaves_a_complete_checkpoint_and_an_exact_resume(tmp_path, tiny_corpus):
    data_dir = tmp_path / "data"
    reference = tmp_path / "reference"
    subprocess.run(trainer(tiny_corpus, reference, data_dir), check=True, capture_output=True, env=python_env())

    out = tmp_path / "killed"
    rng = random.Random(20261129)
    env = python_env(TINYGPT_TEST_SLOW_CHECKPOINT_S="0.1")  # widen the window for a kill mid-write
    kills, mid_write, saved_before = 0, 0, False
    for _ in range(20):
        before = last_logged_step(out)
        proc = subprocess.Popen(trainer(tiny_corpus, out, data_dir), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 60
        while last_logged_step(out) <= max(before, 0) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)  # until this life is training
        time.sleep(rng.uniform(0.0, 1.2))
        if proc.poll() is not None:
            break  # finished before we could kill it
        mid_write += any(ckpt.checkpoint_dir(out).glob(".step_*.tmp"))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        # Every checkpoint with a final name is complete and loads; the newest valid one is found.
        names = ckpt.list_checkpoints(out)
        if not names:
            assert not saved_before, "a kill lost every complete checkpoint"
            continue  # killed before the very first checkpoint was complete
        saved_before = True
        for path in names:
            ckpt.load(path)
        path, state = ckpt.load_newest(out, warn=pytest.fail)
        assert path == names[-1] and state["step"] >= 4
    assert kills == 20
    print(f"\nSIGKILL survived: {kills} kills, {mid_write} of them while a checkpoint was being written")
    done = subprocess.run(trainer(tiny_corpus, out, data_dir), capture_output=True, text=True, env=python_env())
    assert done.returncode == 0, done.stderr
    assert loss_series(out) == loss_series(reference)  # nothing lost or repeated, bit for bit
    assert mid_write >= 1  # the slowed writes made at least one kill land mid-write


def run_until_logging(cmd, out, env):
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    while last_logged_step(out) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return proc


def test_preemption_signal_without_scontrol_saves_and_exits_for_resubmission(tmp_path, tiny_corpus):
    out = tmp_path / "run"
    bindir = tmp_path / "bin"  # a PATH with python but no scontrol, as inside a container
    bindir.mkdir()
    env = python_env(SLURM_JOB_ID="4242", PATH=str(bindir), TINYGPT_TEST_SLOW_CHECKPOINT_S="0.05")
    proc = run_until_logging(trainer(tiny_corpus, out, tmp_path / "data"), out, env)
    proc.send_signal(signal.SIGUSR2)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 75, stdout + stderr  # EXIT_REQUEUE: the batch script resubmits
    event = read_metrics(out)[-1]
    assert event["event"] == "preempted" and "SIGUSR2" in event["reason"]
    assert "scontrol is not on PATH" in event["requeue"]
    assert ckpt.load_newest(out, warn=pytest.fail)[1]["step"] == event["step"]


def test_sigterm_saves_and_stops_without_requeue(tmp_path, tiny_corpus):
    out = tmp_path / "run"
    proc = run_until_logging(trainer(tiny_corpus, out, tmp_path / "data"), out, python_env())
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    event = read_metrics(out)[-1]
    assert event["event"] == "preempted" and "terminated" in event["reason"] and "requeue" not in event
    assert ckpt.load_newest(out, warn=pytest.fail)[1]["step"] == event["step"]


def test_requeue_loops_are_capped(tmp_path, tiny_corpus):
    out = tmp_path / "run"
    env = python_env(SLURM_JOB_ID="4242", SLURM_RESTART_COUNT="3")
    proc = run_until_logging(trainer(tiny_corpus, out, tmp_path / "data", "--max-requeues", "3"), out, env)
    proc.send_signal(signal.SIGUSR2)
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    event = read_metrics(out)[-1]
    assert event["restarts"] == 3 and "reached max_requeues" in event["requeue"]


SIGNAL_WHILE_PYTHON_SHUTS_DOWN = """
import os, signal
from tinygpt import preemption, train
preemption.install_early_recorder()  # as `python -m tinygpt.train` starts


class Late:  # cleared with __main__'s globals, after Python has put the default signal actions back
    def __del__(self, kill=os.kill, pid=os.getpid(), sig=signal.SIGUSR2):
        kill(pid, sig)  # the time limit's warning, as the process leaves


late = Late()
train.exit_process(0)
"""


def test_a_signal_while_the_trainer_exits_does_not_kill_it():
    """Seen in CI: a requeued life finished all its steps and died of SIGUSR2 on its way out, failing the job."""
    done = subprocess.run([sys.executable, "-c", SIGNAL_WHILE_PYTHON_SHUTS_DOWN], capture_output=True, text=True,
                          env=python_env(), timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr)


def test_interrupted_checkpoint_write_leaves_no_partial_file(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch, "save", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        ckpt.save(tmp_path, {"step": 5})
    assert list(ckpt.checkpoint_dir(tmp_path).iterdir()) == []


def test_checkpoint_loads_with_weights_only_and_rejects_garbage(tmp_path):
    folder = ckpt.checkpoint_dir(tmp_path)
    folder.mkdir(parents=True)
    (folder / "step_00000009.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(ckpt.CheckpointError, match="unreadable"):
        ckpt.load(folder / "step_00000009.pt")
    import torch

    torch.save({"format": 1, "step": 3}, folder / "step_00000003.pt")
    with pytest.raises(ckpt.CheckpointError, match="incomplete, missing model"):
        ckpt.load(folder / "step_00000003.pt")
    warnings = []
    assert ckpt.load_newest(tmp_path, warn=warnings.append) == (None, None) and len(warnings) == 2


def test_an_early_preemption_signal_is_kept_until_training_can_stop(tmp_path, tiny_corpus):
    """Slurm's warning can arrive while Python is still importing torch: the run saves at its first step."""
    out = tmp_path / "run"
    bindir = tmp_path / "bin"  # no scontrol: the trainer asks the batch script to resubmit (exit 75)
    bindir.mkdir()
    proc = subprocess.Popen(trainer(tiny_corpus, out, tmp_path / "data"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=python_env(SLURM_JOB_ID="4242", PATH=str(bindir)))
    time.sleep(0.3)  # still starting up
    proc.send_signal(signal.SIGUSR2)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 75, stdout + stderr
    event = read_metrics(out)[-1]
    assert event["event"] == "preempted" and event["step"] == 1


def test_a_late_preemption_signal_does_not_kill_a_finished_run(tmp_path, tiny_corpus):
    """The time limit's warning can arrive while the run writes its sample: it must still end well."""
    out = tmp_path / "run"
    cmd = trainer(tiny_corpus, out, tmp_path / "data", "--max-steps", "30", "--sample-tokens", "20000")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=python_env())
    wait_for = time.monotonic() + 60
    while not (out / "checkpoints" / "step_00000030.pt").exists() and time.monotonic() < wait_for:
        time.sleep(0.02)  # training is over; the long sample is being generated
    proc.send_signal(signal.SIGUSR2)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert read_metrics(out)[-1]["event"] == "finished" and "done: step 30" in stdout
