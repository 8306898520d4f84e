"""`launch.py resubmit`: only the runs that ended badly go back to the queue, and they resume.

Two tasks of an array are made to fail the way a crash or the kernel's OOM killer ends a trainer: SIGKILL
to the trainer process once it has saved a checkpoint (no handler runs; srun reports the task killed, the
batch script exits with its status and the task ends FAILED).
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import launch
from tests.support.slurm import manifest_of, trainer_pid, wait, wait_until
from tests.support.tiny import read_metrics, tiny_yaml
from tinygpt.launch.act import resubmit
from tinygpt.launch.errors import LaunchError

TINY = tiny_yaml(eval_interval=50, ckpt_interval=10, log_interval=5)


def sacct_view(job_ids: list[str]) -> str:
    out = subprocess.run(["sacct", "-X", "-P", "-j", ",".join(job_ids), "-o", "JobID,State,ExitCode,NodeList"],
                         capture_output=True, text=True, timeout=30)
    return out.stdout


def kill_trainer_when_training(work: Path, sweep: str, index: int) -> None:
    """SIGKILL the trainer process of run `index` (the pid its run-directory lock records; the nodes of the local
    cluster share this machine's processes) once it has logged 3 training lines (past its checkpoint at step 10)."""
    run = manifest_of(work, sweep).runs[index]
    metrics = Path(run.out_dir) / "metrics.jsonl"
    wait_until(lambda: metrics.exists() and metrics.read_text().count('"lr"') >= 3, timeout=120, poll=0.05,
               what=f"run {index} training")
    holder = json.loads((Path(run.out_dir) / ".lock").read_text())  # the trainer's own record (rundir_lock)
    os.kill(int(holder["pid"]), signal.SIGKILL)



OLDER_CODE = {  # where the code snapshots of earlier sweeps keep the task (node/train_task.FIRST_TASK_PATH)
    "tinygpt/__init__.py": "",
    "tinygpt/launch/__init__.py": "",
    "tinygpt/launch/backends.py": "class TrainTask:\n    def __call__(self, manifest_path, index):\n"
                                  "        return f'older code trains run {index} of {manifest_path}'\n",
}


def test_a_resubmitted_submitit_task_unpickles_as_the_class_its_own_snapshot_has(tmp_path):
    """A submitit resubmission pickles the task by the import path its sweep's code snapshot has (the manifest's
    record, else the path of the snapshots made before it was recorded): the job, running that snapshot,
    unpickles its own class and calls it; a new sweep's task is this code's TrainTask itself."""
    import cloudpickle  # (submitit's pickler)

    from tinygpt.launch.node import train_task

    for name, text in OLDER_CODE.items():
        (tmp_path / "code" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "code" / name).write_text(text)
    (tmp_path / "task.pkl").write_bytes(cloudpickle.dumps(train_task.task_at(train_task.FIRST_TASK_PATH)))
    load = "import pickle, sys; task = pickle.load(open(sys.argv[1], 'rb')); print(type(task).__module__, task('m', 3))"
    out = subprocess.run([sys.executable, "-c", load, str(tmp_path / "task.pkl")], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tmp_path / "code")}, cwd=tmp_path, timeout=60)
    assert out.stdout == "tinygpt.launch.backends older code trains run 3 of m\n", out.stderr
    assert type(train_task.task_at(train_task.TASK_PATH)) is train_task.TrainTask

@pytest.mark.parametrize("time, mem, exclude, message", [
    ("soon", None, [], "--time: 'soon' is not a finite Slurm time"),
    ("INFINITE", None, [], "--time: 'INFINITE' is not a finite Slurm time"),
    (None, "lots", [], "--mem: 'lots' is not a memory size"),
    (None, None, ["node1; rm -rf ~"], "--exclude: 'node1; rm -rf ~' is not a Slurm node list"),
])
def test_bad_resubmit_options_are_named(time, mem, exclude, message):
    with pytest.raises(LaunchError, match=message.replace("[", r"\[")):
        resubmit.parse_changes(time, mem, exclude)


def test_states_and_changes_are_parsed():
    assert resubmit.parse_states("failed, TIMEOUT") == ("FAILED", "TIMEOUT")
    with pytest.raises(LaunchError, match="--states: RUNNING not among"):
        resubmit.parse_states("FAILED,RUNNING")
    changes = resubmit.parse_changes("90", "8G", ["node1", "node[3-4]", "node1"])
    assert changes.sbatch_args() == ["--time=01:30:00", "--mem=8192M", "--exclude=node1,node[3-4]"]


@pytest.mark.slurm
@pytest.mark.shares_cluster
def test_resubmit_runs_exactly_the_failed_tasks_again_and_they_resume(tmp_path, tiny_corpus):
    work = tmp_path / "w"
    spec = tmp_path / "four.yaml"
    # Runs 1 and 3 fail between runs that complete: what is sent again is exactly them, a gapped array.
    spec.write_text(f"name: four\ntrain: {{data_file: {tiny_corpus}, {TINY}, max_steps: 30}}\n"
                    "runs:\n" + "".join(f"  - {{name: r{i}, seed: {i}}}\n" for i in range(4))
                    .replace("seed: 1}", "seed: 1, max_steps: 500}").replace("seed: 3}", "seed: 3, max_steps: 500}")
                    + "resources: {time: '00:10:00'}\n")
    assert launch(str(spec), "--workdir", str(work)).returncode == 0
    ids = manifest_of(work, "four").task_job_ids()
    for victim in (1, 3):  # SIGKILL once the run has saved a checkpoint (step 10)
        kill_trainer_when_training(work, "four", victim)
    before = {i: wait(job) for i, job in ids.items()}
    print("sacct before resubmit:\n" + sacct_view(sorted(set(ids.values()))))
    assert [i for i, state in before.items() if state != "COMPLETED"] == [1, 3], before
    assert {before[1], before[3]} == {"FAILED"}

    dry = launch("resubmit", str(spec), "--workdir", str(work), "--dry-run", "--time", "00:20:00")
    assert dry.returncode == 0 and "resubmitting 2 of 4 run(s): r1 (" in dry.stdout, dry.stdout + dry.stderr
    assert "--array=1,3 --time=00:20:00" in dry.stdout and len(manifest_of(work, "four").submissions) == 1
    out = launch("resubmit", str(spec), "--workdir", str(work), "--time", "00:20:00")
    assert out.returncode == 0, out.stdout + out.stderr
    manifest = manifest_of(work, "four")
    new = manifest.submissions[-1]
    assert new.indices == [1, 3] and new.array == "1,3" and new.changes == {"time": "00:20:00"}
    assert {k: v.state for k, v in new.previous.items()} == {"1": "FAILED", "3": "FAILED"}
    after = manifest.task_job_ids()
    assert [after[i] == ids[i] for i in range(4)] == [True, False, True, False]
    assert wait(after[1], timeout=300) == wait(after[3], timeout=300) == "COMPLETED"
    print("sacct after resubmit:\n" + sacct_view(sorted({*ids.values(), *after.values()})))
    for victim in (1, 3):
        records = read_metrics(work / "runs" / "four" / f"r{victim}")
        starts = [r for r in records if r.get("event") == "start"]
        assert len(starts) == 2 and starts[1]["step"] >= 10  # the second life resumed from a checkpoint
        assert records[-1]["event"] == "finished" and records[-1]["step"] == 500
    status = launch("status", str(spec), "--workdir", str(work))
    assert status.stdout.count("COMPLETED") == 4 and f"{ids[1]} FAILED on node" in status.stdout, status.stdout
    again = launch("resubmit", str(spec), "--workdir", str(work))
    assert again.returncode == 0 and "nothing to resubmit" in again.stdout


@pytest.mark.slurm
@pytest.mark.shares_cluster
def test_resubmit_with_the_submitit_backend(tmp_path, tiny_corpus):
    work = tmp_path / "w"
    spec = tmp_path / "pair.yaml"
    spec.write_text(f"name: pair\nbackend: submitit\ntrain: {{data_file: {tiny_corpus}, {TINY}, max_steps: 30}}\n"
                    "runs:\n  - {name: quick}\n  - {name: doomed, max_steps: 500}\nresources: {time: '00:10:00'}\n")
    assert launch(str(spec), "--workdir", str(work)).returncode == 0
    ids = manifest_of(work, "pair").task_job_ids()
    kill_trainer_when_training(work, "pair", 1)
    assert (wait(ids[0]), wait(ids[1])) == ("COMPLETED", "FAILED")
    out = launch("resubmit", str(spec), "--workdir", str(work), "--mem", "1G")
    assert out.returncode == 0 and "resubmitting 1 of 2 run(s): doomed (" in out.stdout, out.stdout + out.stderr
    new = manifest_of(work, "pair").submissions[-1]
    assert new.indices == [1] and new.executor["additional_parameters"]["mem"] == "1024M"
    assert wait(manifest_of(work, "pair").task_job_ids()[1], timeout=300) == "COMPLETED"
    records = read_metrics(work / "runs" / "pair" / "doomed")
    assert [r["step"] >= 10 for r in records if r.get("event") == "start"] == [False, True]
    assert records[-1]["event"] == "finished"


@pytest.mark.slurm
def test_a_stopped_rank_ends_its_two_node_job_as_hung_and_resubmit_finishes_the_run_exactly(tmp_path, tiny_corpus):
    """SIGSTOP rank 0 (on node1, where the rendezvous store lives) of a two-node run mid-training: rank 1's
    watchdog ends the job after hang_timeout with its stacks and a `hung` record; status says HUNG; resubmit
    finishes the run from its newest checkpoint with the weights of the same run left alone. (A stopped rank
    1 is the torchrun test's, in test_distributed.py.)"""
    work = tmp_path / "w"
    spec = tmp_path / "hang.yaml"
    spec.write_text(f"name: hang\ntrain: {{data_file: {tiny_corpus}, {TINY}, max_steps: 150, hang_timeout: 3}}\n"
                    "runs: [{name: steady}, {name: stopped}]\n"
                    "resources: {nodes: 2, tasks_per_node: 1, time: '00:10:00'}\n")
    assert launch(str(spec), "--workdir", str(work)).returncode == 0
    ids = manifest_of(work, "hang").task_job_ids()
    metrics = work / "runs" / "hang" / "stopped" / "metrics.jsonl"
    victim = trainer_pid(ids[1], 0)
    wait_until(lambda: metrics.exists() and metrics.read_text().count('"lr"') >= 4, timeout=120, poll=0.05,
               what="the run training past its first checkpoint")
    os.kill(victim, signal.SIGSTOP)
    assert wait(ids[1], timeout=120) == "FAILED"
    assert wait(ids[0], timeout=300) == "COMPLETED"
    log = (work / "logs" / "hang" / f"{ids[1]}.out").read_text()
    assert "error: rank 1 on node2: no step, evaluation or checkpoint has completed for 3 s" in log, log[-3000:]
    assert "no answer from rank(s) 0 (node1)" in log and "(most recent call first)" in log
    # (the newest hung record, not the last line: Slurm wakes the stopped rank 0 (SIGCONT) to end it, and it may
    # write one more line of its step before its SIGKILL comes)
    hung = [r for r in read_metrics(work / "runs" / "hang" / "stopped") if r.get("event") == "hung"][-1]
    assert (hung["event"], hung["rank"], hung["silent_ranks"], hung["silent_nodes"]) == ("hung", 1, [0], ["node1"])
    status = launch("status", str(spec), "--workdir", str(work)).stdout
    assert f"HUNG at step {hung['step']}" in status and "no step, evaluation or checkpoint" in status, status
    dry = launch("resubmit", str(spec), "--workdir", str(work), "--exclude-failed-nodes", "--dry-run").stdout
    assert "nodes where a run ended in NODE_FAIL or BOOT_FAIL or HUNG: node1" in dry
    assert "resubmitting 1 of 2 run(s): stopped" in dry
    assert launch("resubmit", str(spec), "--workdir", str(work)).returncode == 0
    assert wait(manifest_of(work, "hang").task_job_ids()[1], timeout=300) == "COMPLETED"
    steady, stopped = (read_metrics(work / "runs" / "hang" / name)[-1] for name in ("steady", "stopped"))
    assert stopped["event"] == "finished" and stopped["weights_digest"] == steady["weights_digest"]
    assert stopped["best_val_loss"] == steady["best_val_loss"]
