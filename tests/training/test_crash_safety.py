"""Kills and signals on one machine: checkpoints stay complete, runs resume exactly, requeue has a fallback."""

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import python_env, slow_saves, wait_until
from tests.support.tiny import TINY_FLAGS, loss_series, read_metrics
from tinygpt.launch.submit.fork_server import Forked
from tinygpt.training import checkpoint as ckpt
from tinygpt.training import preemption
from tinygpt.training.trainer import Trainer

PARTS = Trainer.PARTS

CRASH_FLAGS = [*TINY_FLAGS, "--max-steps", "400", "--ckpt-interval", "4", "--keep-checkpoints", "2",
               "--log-interval", "1", "--eval-interval", "25", "--dropout", "0.1"]


def trainer_args(corpus, out, data_dir, *extra) -> list[str]:
    return [*CRASH_FLAGS, "--data-file", str(corpus), "--out-dir", str(out), "--data-dir", str(data_dir), *extra]


def trainer(corpus, out, data_dir, *extra, env: dict | None = None) -> Forked:
    """A trainer process (forked warm: tinygpt/launch/submit/fork_server.py), its output kept for communicate()."""
    return Forked("tinygpt.train", trainer_args(corpus, out, data_dir, *extra), env or python_env())


def catches(pid: int, sig: int) -> bool:
    """The process has a handler for `sig` (bit sig-1 of SigCgt in /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(mask, 16) >> (sig - 1) & 1)


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


def test_sigkill_at_chosen_moments_leaves_a_complete_checkpoint_and_an_exact_resume(tmp_path, tiny_corpus):
    """Twenty lives, each SIGKILLed at an event: ten while a checkpoint is being written (the write stalls
    after its bytes, before the rename, so the kill surely lands there), ten a seeded number of steps into
    training (wherever the trainer then is: a step, a log line, a write). Never at a moment a clock chose.
    (bench/lock_trials.py --kill kills many more lives, at moments it draws.)"""
    data_dir = tmp_path / "data"
    reference = tmp_path / "reference"
    first = trainer(tiny_corpus, reference, data_dir)
    assert first.wait(300) == 0, first.communicate()[1]

    out = tmp_path / "killed"
    folder = ckpt.checkpoint_dir(out)
    rng = random.Random(20261129)
    moments = ["mid-write"] * 10 + ["mid-training"] * 10
    rng.shuffle(moments)
    saved_before = False
    for moment in moments:
        before = last_logged_step(out)
        leftovers = set(folder.glob(".step_*.tmp"))
        stall = 3600 if moment == "mid-write" else 0  # the first write of this life never finishes
        proc = trainer(tiny_corpus, out, data_dir, env=python_env(**slow_saves(stall)))
        if moment == "mid-write":
            wait_until(lambda old=leftovers: set(folder.glob(".step_*.tmp")) - old, poll=0.01, what="checkpoint write",
                       proc=proc)
        else:
            target = max(before, 0) + rng.randint(1, 8)
            wait_until(lambda t=target: last_logged_step(out) >= t, poll=0.01, what=f"step {target}", proc=proc)
        proc.kill()
        proc.communicate()
        # Every checkpoint with a final name is complete and loads; the newest valid one is found.
        names = ckpt.list_checkpoints(out)
        if not names:
            assert not saved_before, "a kill lost every complete checkpoint"
            continue  # killed before the very first checkpoint was complete
        saved_before = True
        for path in names:
            ckpt.load(path, PARTS)
        newest = ckpt.load_newest(out, pytest.fail, PARTS)
        assert newest.path == names[-1] and newest.step >= 4
    assert saved_before and last_logged_step(out) < 400  # every life was killed before the end
    done = trainer(tiny_corpus, out, data_dir)
    assert done.wait(300) == 0, done.communicate()[1]
    assert loss_series(out) == loss_series(reference)  # nothing lost or repeated, bit for bit


def run_until_logging(proc: Forked, out) -> Forked:
    wait_until(lambda: last_logged_step(out) >= 3, poll=0.01, what="third step", proc=proc)
    return proc


def test_preemption_signal_without_scontrol_saves_and_exits_for_resubmission(tmp_path, tiny_corpus):
    out = tmp_path / "run"
    bindir = tmp_path / "bin"  # a PATH with python but no scontrol, as inside a container
    bindir.mkdir()
    env = python_env(SLURM_JOB_ID="4242", PATH=str(bindir), **slow_saves(0.05))
    proc = run_until_logging(trainer(tiny_corpus, out, tmp_path / "data", env=env), out)
    proc.send_signal(signal.SIGUSR2)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 75, stdout + stderr  # tinygpt.job.REQUEUE_EXIT: the batch script resubmits
    event = read_metrics(out)[-1]
    assert event["event"] == "preempted" and "SIGUSR2" in event["reason"]
    assert "scontrol is not on PATH" in event["requeue"]
    assert ckpt.load_newest(out, pytest.fail, PARTS).step == event["step"]


def test_sigterm_saves_and_stops_without_requeue(tmp_path, tiny_corpus):
    out = tmp_path / "run"
    proc = run_until_logging(trainer(tiny_corpus, out, tmp_path / "data"), out)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    event = read_metrics(out)[-1]
    assert event["event"] == "preempted" and "terminated" in event["reason"] and "requeue" not in event
    assert ckpt.load_newest(out, pytest.fail, PARTS).step == event["step"]


def test_requeue_loops_are_capped(tmp_path, tiny_corpus):
    out = tmp_path / "run"
    env = python_env(SLURM_JOB_ID="4242", SLURM_RESTART_COUNT="3")
    proc = run_until_logging(trainer(tiny_corpus, out, tmp_path / "data", "--max-requeues", "3", env=env), out)
    proc.send_signal(signal.SIGUSR2)
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    event = read_metrics(out)[-1]
    assert event["restarts"] == 3 and "reached max_requeues" in event["requeue"]


SIGNAL_WHILE_PYTHON_SHUTS_DOWN = """
import os, signal
from tinygpt import train
from tinygpt.training import preemption
preemption.install_early_recorder()  # as `python -m tinygpt.train` starts


class Late:  # cleared with __main__'s globals, after Python has put the default signal actions back
    def __del__(self, kill=os.kill, pid=os.getpid(), sig=signal.SIGUSR2):
        kill(pid, sig)  # the time limit's warning, as the process leaves


late = Late()
train.exit_process(0)
"""


def test_a_signal_while_the_trainer_exits_does_not_kill_it():
    """A time-limit warning while Python shuts down after a finished run must not fail the job."""
    done = subprocess.run([sys.executable, "-c", SIGNAL_WHILE_PYTHON_SHUTS_DOWN], capture_output=True, text=True,
                          env=python_env(), timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr)


def test_a_late_preemption_signal_does_not_kill_the_requeue_call(tmp_path, monkeypatch):
    """On two nodes, Slurm's signal can reach rank 0's node after the other rank has stopped the run and rank 0 is
    already asking for the requeue: the signal reaches every process of the step, the `scontrol requeue` call too
    (a stand-in here: a real cluster does not produce the late signal on demand)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    (bindir / "scontrol").write_text(f'#!/bin/bash\nkill -USR2 $$\necho "$@" >> {calls}\n')
    (bindir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    caught = []
    previous = signal.signal(signal.SIGUSR2, lambda *_: caught.append(True))
    try:
        assert preemption.requeue("4242") == (True, "requeued job 4242")
        assert calls.read_text() == "requeue 4242\n"
        assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == set()  # nothing left blocked here
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_interrupted_checkpoint_write_leaves_no_partial_file(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch, "save", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        ckpt.save(tmp_path, 5, {"model": torch.nn.Linear(2, 2)}, meta={})
    assert list(ckpt.checkpoint_dir(tmp_path).iterdir()) == []


def test_checkpoint_loads_with_weights_only_and_rejects_garbage(tmp_path):
    folder = ckpt.checkpoint_dir(tmp_path)
    folder.mkdir(parents=True)
    (folder / "step_00000009.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(ckpt.CheckpointError, match="unreadable"):
        ckpt.load(folder / "step_00000009.pt")
    import torch

    torch.save({"format": 2, "step": 3, "meta": {}, "parts": {"optimizer": {}}}, folder / "step_00000003.pt")
    with pytest.raises(ckpt.CheckpointError, match="incomplete, missing model"):
        ckpt.load(folder / "step_00000003.pt", required=PARTS)
    warnings = []
    assert ckpt.load_newest(tmp_path, warnings.append, PARTS) is None and len(warnings) == 2


def test_an_early_preemption_signal_is_kept_until_training_can_stop(tmp_path, tiny_corpus):
    """Slurm's warning can arrive while Python is still importing torch: the run saves at its first step.
    (An interpreter of its own, started cold: its start is what this is about.)"""
    out = tmp_path / "run"
    bindir = tmp_path / "bin"  # no scontrol: the trainer asks the batch script to resubmit (exit 75)
    bindir.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "tinygpt.train", *trainer_args(tiny_corpus, out, tmp_path / "data")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=python_env(SLURM_JOB_ID="4242", PATH=str(bindir)))
    # The moment the early recorder catches SIGUSR2 (the kernel's SigCgt mask says so): torch is not
    # imported yet, let alone a step taken.
    wait_until(lambda: catches(proc.pid, signal.SIGUSR2), poll=0.01, what="handler for SIGUSR2", proc=proc)
    proc.send_signal(signal.SIGUSR2)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 75, stdout + stderr
    event = read_metrics(out)[-1]
    assert event["event"] == "preempted" and event["step"] == 1


# Test-only, put first on a trainer's PYTHONPATH: when pydantic (the configuration's schema, the first heavy import)
# starts to load, it writes whether SIGUSR2 is caught by then.
SCHEMA_LOAD_WATCH = """import os, signal, sys
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "pydantic":
            sys.meta_path.remove(self)
            with open(os.environ["SIGNAL_AT_SCHEMA"], "w") as out:
                out.write(str(signal.getsignal(signal.SIGUSR2) not in (signal.SIG_DFL, None)))
sys.meta_path.insert(0, Watch())
"""


@pytest.mark.parametrize("start", ["python -m", "console script"])
def test_slurms_signals_are_recorded_before_the_configuration_loads(tmp_path, start):
    """The window in which Slurm's warning still kills a trainer with the default action is the interpreter's start
    and tinygpt's few light modules, not its configuration's schema too (on a loaded node, loading pydantic can
    outlast a short job's warning)."""
    (tmp_path / "sitecustomize.py").write_text(SCHEMA_LOAD_WATCH)
    command = {"python -m": [sys.executable, "-m", "tinygpt.train"],
               "console script": [str(Path(sys.executable).parent / "tinygpt-train")]}[start]
    said = tmp_path / "said"
    env = python_env(SIGNAL_AT_SCHEMA=str(said))
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
    out = subprocess.run([*command, "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and "--n-layer" in out.stdout, out.stderr
    assert said.read_text() == "True"


def test_a_late_preemption_signal_does_not_kill_a_finished_run(tmp_path, tiny_corpus):
    """The time limit's warning can arrive while the run writes its sample: it must still end well. The sample's
    write is held open (tests/support/slow_saves) until the signal has been sent."""
    out, gate = tmp_path / "run", tmp_path / "gate"
    env = python_env(**slow_saves(0), TINYGPT_TEST_SAMPLE_GATE=str(gate))
    proc = trainer(tiny_corpus, out, tmp_path / "data", "--max-steps", "30", "--sample-tokens", "50", env=env)
    wait_until(lambda: any(out.glob(".samples.txt.*.tmp")), poll=0.01, what="the sample's write", proc=proc)
    proc.send_signal(signal.SIGUSR2)
    gate.touch()
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert read_metrics(out)[-1]["event"] == "finished" and "done: step 30" in stdout
