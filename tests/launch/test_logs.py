"""`launch.py logs` and the failure lines of `status`, on the local cluster."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tests.support.processes import launch
from tests.support.slurm import job_env, manifest_of, run_to_completion, signal_when_training, wait
from tests.support.sweeps import hand_made_manifest
from tests.support.tiny import tiny_yaml
from tinygpt.launch import api
from tinygpt.launch.read import log_files

TINY = tiny_yaml(eval_interval=10, max_steps=20)


@pytest.mark.slurm
@pytest.mark.shares_cluster
def test_logs_show_the_latest_life_or_all_and_status_says_why_a_run_failed(tmp_path, tiny_corpus):
    work = tmp_path / "w"
    spec = tmp_path / "three.yaml"
    spec.write_text(f"name: three\ntrain: {{data_file: {tiny_corpus}, {TINY}}}\nruns:\n  - {{name: ok}}\n"
                    f"  - {{name: bad, resume: {tiny_corpus}}}\n  - {{name: twice, max_steps: 400}}\n"
                    "resources: {time: '00:10:00'}\n")
    assert launch(str(spec), "--workdir", str(work)).returncode == 0

    manifest = manifest_of(work, "three")
    ids = manifest.task_job_ids()
    follower = subprocess.Popen([sys.executable, str(ROOT / "launch.py"), "logs", str(spec), "twice", "--follow",
                                 "--workdir", str(work)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=job_env(), cwd=ROOT)
    signal_when_training(ids[2], work / "runs" / "three" / "twice" / "metrics.jsonl")  # preempted once
    assert (wait(ids[0]), wait(ids[1])) == ("COMPLETED", "FAILED")
    assert run_to_completion(ids[2]) == ("COMPLETED", 1)
    followed, _ = follower.communicate(timeout=60)  # it stops by itself once the job has ended
    assert follower.returncode == 0 and "restart 0" in followed and "restart 1" in followed
    assert "done: step 400" in followed
    assert "".join(api.open_sweep(spec, work).follow("twice", poll=0.1)) == followed  # (the library's, after the end)

    bad = launch("logs", str(spec), "bad", "--workdir", str(work))
    assert bad.returncode == 0 and f"==> run bad (#1), job {ids[1]} on node" in bad.stdout, bad.stdout + bad.stderr
    assert f"resume: {tiny_corpus}: unreadable: not a whole checkpoint file" in bad.stdout  # (a text file)
    status = launch("status", str(spec), "--workdir", str(work))
    assert f"bad ({ids[1]} FAILED): error: resume: {tiny_corpus}: unreadable" in status.stdout
    assert "ok (" not in status.stdout.split("failed")[-1]  # only the failed run is explained
    document = json.loads(launch("status", str(spec), "--workdir", str(work), "--json").stdout)
    errors = {r["name"]: r["error"] for r in document["runs"]}  # (the same line, for scripts and the page)
    assert errors["ok"] is None and errors["bad"].startswith(f"error: resume: {tiny_corpus}: unreadable"), errors

    latest = launch("logs", str(spec), "2", "--workdir", str(work)).stdout  # by number
    assert "latest life" in latest and "restart 1" in latest and "restart 0" not in latest
    every = launch("logs", str(spec), "twice", "--all", "--workdir", str(work)).stdout
    assert "whole log" in every and "restart 0" in every and "restart 1" in every
    tail = launch("logs", str(spec), "--tail", "2", "--workdir", str(work)).stdout.splitlines()
    assert [line.startswith("==> run ") for line in tail] == [True, False, False] * 3, tail
    wrong = launch("logs", str(spec), "twise", "--workdir", str(work))
    assert wrong.returncode == 1 and "no run `twise` in sweep three (did you mean `twice`?)" in wrong.stderr


def test_the_latest_life_starts_at_the_last_start_line():
    text = ("tinygpt: run 0 (c.yaml), job 5_0 on node1, restart 0\nstep 1\npreempted\n"
            "tinygpt: run 0 (c.yaml), job 5_0 on node2, restart 1\nstep 2\ndone\n")
    assert log_files.latest_life(text) == "tinygpt: run 0 (c.yaml), job 5_0 on node2, restart 1\nstep 2\ndone\n"
    assert log_files.latest_life("no header\n") == "no header\n"


def test_the_error_line_is_ours_then_pythons_then_slurms(tmp_path):
    manifest = hand_made_manifest(tmp_path, 1, [{"job_id": "7", "indices": [0], "array": "0"}])
    log = Path(manifest.logs_dir) / "7_0.out"
    log.parent.mkdir(parents=True)
    log.write_text("tinygpt: run 0 (c), job 7_0 on node1\nTraceback (most recent call last):\n"
                   "RuntimeError: CUDA error: an illegal memory access\nsrun: error: node1: task 0: Exited\n"
                   "srun: Terminating StepId=7.0 on signal\n")
    assert log_files.last_error(manifest, 0) == "RuntimeError: CUDA error: an illegal memory access"
    log.write_text("tinygpt: run 0 (c), job 7_0 on node1\nerror: data_file: x does not exist\n"
                   "srun: error: node1: task 0: Exited with exit code 2\n")
    assert log_files.last_error(manifest, 0) == "error: data_file: x does not exist"
    log.write_text("tinygpt: run 0 (c), job 7_0 on node1\nstep 5\n"
                   "slurmstepd: *** JOB 7 CANCELLED DUE TO TIME LIMIT ***\n")
    assert log_files.last_error(manifest, 0) == "slurmstepd: *** JOB 7 CANCELLED DUE TO TIME LIMIT ***"
