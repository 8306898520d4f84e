"""Preemption as Slurm does it and a node lost mid-job, on the real local cluster (`up.sh --nodes 2 --preemption`).

Jobs in partition `high` take the nodes of jobs in `low` (PreemptMode=REQUEUE: Slurm requeues them itself)
and `low-cancel` (PreemptMode=CANCEL: they end PREEMPTED). A node is crashed with `node.sh crash`: SIGKILL to
its slurmd and every process in its namespace, no handler runs; slurmctld calls the job NODE_FAIL.

Whatever the machine's speed, each run is interrupted mid-training: its first life aims at a step count no
machine reaches, with a learning-rate schedule of fixed length (lr_decay_steps), and once the interruption
has happened the test sets the real end in the manifest, which every start reads. The uninterrupted run it
is compared with trains to that same end.
"""

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.processes import launch, run_world
from tests.support.slurm import (
    TERMINAL,
    cancel,
    events,
    in_service,
    job_env,
    launched,
    manifest_of,
    node,
    reference,
    run_to_completion,
    take_every_node,
    wait,
    wait_until,
)
from tests.support.sweeps import sweep_dirs
from tests.support.tiny import TINY_FLAGS, loss_series, read_metrics
from tinygpt.base import config, durable
from tinygpt.launch import manifest as manifest_mod
from tinygpt.launch.read import run_states

pytestmark = pytest.mark.slurm
FOREVER = 10**9


def train_keys(corpus: Path, data: Path, **extra) -> dict:
    keys = {a.lstrip("-").replace("-", "_"): v for a, v in zip(TINY_FLAGS[::2], TINY_FLAGS[1::2])}
    keys.update(data_file=str(corpus), data_dir=str(data), max_steps=FOREVER, lr_decay_steps=400,
                log_interval=5, eval_interval=100, ckpt_interval=20, dropout=0.1, **extra)
    return keys


def launch_sweep(tmp_path: Path, name: str, keys: dict, resources: dict, runs: tuple[str, ...] = ("run",)):
    """Launch a sweep of `runs` (same settings each): (its spec, its workdir, its manifest)."""
    spec, work = tmp_path / f"{name}.yaml", tmp_path / "w"
    spec.write_text(json.dumps({"name": name, "train": keys, "runs": [{"name": run} for run in runs],
                                "resources": {"time": "00:10:00", **resources}}))
    return spec, work, launched(spec, work)


def end_at(work: Path, name: str, max_steps: int) -> None:
    """The run's real end, in the manifest its next start reads its config from."""
    path = sweep_dirs(work, name).manifest
    manifest = json.loads(path.read_text())
    manifest["base"]["max_steps"] = max_steps
    for run in manifest["runs"]:
        run["max_steps"] = max_steps
    durable.write(path, json.dumps(manifest, indent=1))  # (whole or not at all: the task reads it as it starts)


def training(run_dir: Path, lines: int = 5) -> bool:
    metrics = run_dir / "metrics.jsonl"
    return metrics.exists() and metrics.read_text().count('"lr"') >= lines


def logs(work: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted((work / "logs").rglob("*.out")))


def status_of(work: Path, name: str, want: str, source: str | None = None) -> run_states.Row:
    """The run's row once `status` says `want` (from `source`, when given: accounting lags the controller by a
    moment)."""
    path = sweep_dirs(work, name).manifest
    rows: list[run_states.Row] = []

    def says() -> bool:
        rows[:] = run_states.collect(manifest_mod.load(path))
        return rows[0].state == want and source in (None, rows[0].source)

    try:
        wait_until(says, timeout=30, poll=0.5, what=f"status saying {want}")
    except TimeoutError:
        raise AssertionError(f"status says {rows[0].state if rows else None}, not {want}: {rows}") from None
    return rows[0]


@pytest.mark.slurm_release
def test_a_task_preempted_under_requeue_comes_back_resumes_exactly_and_is_completed_in_status(tmp_path, tiny_corpus):
    keys = train_keys(tiny_corpus, tmp_path / "data")
    spec, work, manifest = launch_sweep(tmp_path, "requeued", keys, {"partition": "low", "cpus_per_task": 2})
    task, run_dir = manifest.task_job_ids()[0], Path(manifest.runs[0].out_dir)
    high = None
    try:
        wait_until(lambda: training(run_dir), timeout=120, poll=0.05, what="the run training")
        high = take_every_node()
        stop = wait_until(lambda: events(run_dir, "preempted"), timeout=120, what="the preemption")[0]
        final = stop["step"] + 60
        end_at(work, "requeued", final)
        state, restarts = run_to_completion(task)
        assert wait(high) == "COMPLETED"
    finally:
        cancel(task, *([high] if high else []))
    assert (state, restarts) == ("COMPLETED", 1), logs(work)
    assert stop["reason"] == "terminated (scancel or preemption)" and "requeue" not in stop
    assert [e["restarts"] for e in events(run_dir, "start")] == [0, 1]
    assert loss_series(run_dir) == loss_series(reference(config.build({**keys, "max_steps": final,
                                                                        "out_dir": str(tmp_path / "reference")})))
    row = status_of(work, "requeued", "COMPLETED", "sacct")  # sacct's earlier life is PREEMPTED; the latest is not
    assert row.restarts == 1


@pytest.mark.slurm_release
def test_a_task_preempted_under_cancel_is_resubmitted_by_default_and_a_users_scancel_is_not(tmp_path, tiny_corpus):
    """Two runs, one per node: the user scancels one (CANCELLED: a stop, left alone), then a high-priority job
    takes both nodes and Slurm cancels the other (PREEMPTED). A plain `resubmit` sends only the preempted run
    back, and it resumes exactly."""
    keys = train_keys(tiny_corpus, tmp_path / "data")
    spec, work, manifest = launch_sweep(tmp_path, "cancelled", keys, {"partition": "low-cancel", "cpus_per_task": 2},
                                    runs=("preempted", "stopped"))
    ids = manifest.task_job_ids()
    run_dir = Path(manifest.runs[0].out_dir)
    high = None
    try:
        for run_dir_of in (Path(run.out_dir) for run in manifest.runs):
            wait_until(lambda d=run_dir_of: training(d), timeout=120, poll=0.05, what=f"{run_dir_of.name} training")
        cancel(ids[1])
        assert wait(ids[1]) == "CANCELLED"
        high = take_every_node()
        assert wait(ids[0]) == "PREEMPTED"
        assert wait(high) == "COMPLETED"
        stop = events(run_dir, "preempted")[0]
        final = stop["step"] + 60
        end_at(work, "cancelled", final)
        assert status_of(work, "cancelled", "PREEMPTED").index == 0
        out = launch("resubmit", str(spec), "--workdir", str(work))
        assert out.returncode == 0 and "resubmitting 1 of 2 run(s): preempted" in out.stdout, out.stdout + out.stderr
        again = manifest_of(work, "cancelled").task_job_ids()
        assert again[1] == ids[1] and again[0] != ids[0]
        assert wait(again[0]) == "COMPLETED"
    finally:
        cancel(*ids.values(), *([high] if high else []))
    assert loss_series(run_dir) == loss_series(reference(config.build({**keys, "max_steps": final,
                                                                        "out_dir": str(tmp_path / "reference")})))
    row = status_of(work, "cancelled", "COMPLETED")
    assert len(row.history) == 1 and row.history[0].startswith(f"{ids[0]} PREEMPTED on node"), row


def two_rank_reference(tmp_path: Path, keys: dict, max_steps: int) -> Path:
    """The uninterrupted run with two ranks, here (gloo, ranks forked warm: fork_server.py): the same world as
    the two-node job."""
    out = tmp_path / "reference"
    run_config = tmp_path / "reference.yaml"
    run_config.write_text(config.dump_yaml(config.build({**keys, "max_steps": max_steps, "out_dir": str(out)})))
    done = run_world("tinygpt.train", ["--config", str(run_config)], job_env(OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def scontrol(action: str, job: str) -> None:
    done = subprocess.run(["scontrol", action, job], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slurm_release
def test_a_node_lost_mid_job_ends_it_node_fail_and_it_comes_back_from_its_newest_checkpoint(tmp_path, tiny_corpus):
    """node2 of a two-node run crashes past the run's first checkpoint: Slurm ends the job NODE_FAIL and, the
    job being requeueable, queues it again; once node2 is back the run resumes from its newest complete
    checkpoint and ends with the weights of the same run left alone."""
    keys = train_keys(tiny_corpus, tmp_path / "data")
    spec, work, manifest = launch_sweep(tmp_path, "lost", keys, {"nodes": 2, "tasks_per_node": 1})
    task, run_dir = manifest.task_job_ids()[0], Path(manifest.runs[0].out_dir)
    try:
        wait_until(lambda: list((run_dir / "checkpoints").glob("step_*.pt")) and training(run_dir, 8), timeout=120,
                   poll=0.05, what="the run training past its first checkpoint")
        node("crash", "node2")
        try:
            # (as a site's node health check would say at once what slurmctld finds only after SlurmdTimeout)
            subprocess.run(["scontrol", "update", "nodename=node2", "state=down", "reason=crashed"], check=True,
                           timeout=30)
            manifest = manifest_of(work, "lost")
            wait_until(lambda: run_states.collect(manifest)[0].restarts == 1, timeout=120, poll=0.5,
                       what="Slurm requeueing the job of the lost node")
            # Held until node2 is back in service: a life started while node2 registers can have its step (the
            # same step id as the lost life's) cancelled by Slurm within a second (seen once in CI: exit 143),
            # and the run's real end must be in the manifest before its next life reads it.
            scontrol("hold", task)
        finally:
            node("boot", "node2")
        wait_until(lambda: in_service("node2"), timeout=120, poll=0.2, what="node2 back in service")
        checkpoints = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*.pt"))
        lost_at = max(r["step"] for r in read_metrics(run_dir) if "lr" in r)
        final = lost_at + 60
        end_at(work, "lost", final)
        scontrol("release", task)
        state, restarts = run_to_completion(task)
    finally:
        cancel(task)
    def lives() -> list[str]:  # the job's records in accounting, one per life (-D: the requeued ones too)
        return subprocess.run(["sacct", "-X", "-D", "-n", "-P", "-j", task.split("_")[0], "-o", "State"],
                              capture_output=True, text=True, timeout=30).stdout.split()

    # Accounting hears of the end after the controller (seen in a run: RUNNING in sacct, COMPLETED in scontrol).
    wait_until(lambda: set(lives()[-1:]) <= TERMINAL and len(lives()) == restarts + 1, timeout=60, poll=0.2,
               what="sacct recording the job's end")
    # A life started just as node2 is back can still have its step cancelled by Slurm (seen in CI: started 0.5 s
    # after "node2 returned to service", requeued 4 s later): the trainer requeues itself, a REQUEUED life between.
    history = lives()
    assert (state, history[0], history[-1]) == ("COMPLETED", "NODE_FAIL", "COMPLETED"), logs(work)
    assert set(history[1:-1]) <= {"REQUEUED"} and restarts == len(history) - 1, (history, restarts)
    resumed = events(run_dir, "start")[1]
    assert resumed["resumed_from"].endswith(checkpoints[-1]), (resumed, checkpoints)
    uninterrupted = read_metrics(two_rank_reference(tmp_path, keys, final))
    finished = read_metrics(run_dir)[-1]
    assert finished["event"] == "finished" and finished["weights_digest"] == uninterrupted[-1]["weights_digest"]
    assert loss_series(run_dir) == [r for r in ((x["step"], x.get("train_loss"), x.get("val_loss"))
                                                for x in uninterrupted if "event" not in x)]
