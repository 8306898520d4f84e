"""Jobs that survive: signals, requeues and time limits on the real local cluster, resumed exactly."""

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tests.support.processes import slow_saves
from tests.support.slurm import (
    cancel,
    events,
    held_at_first_save,
    job_env,
    job_fields,
    launched,
    python,
    reference,
    run_to_completion,
    sbatch,
    signal_when_training,
    training,
    unique_name,
    wait_until,
)
from tests.support.sweeps import sweep_dirs
from tests.support.tiny import TINY_FLAGS, loss_series, read_metrics
from tinygpt.base import config

# (beside other tests: each signals, requeues or times out its own job alone, and asks for no whole node; its
# jobs wait for CPUs like any other's)
pytestmark = [pytest.mark.slurm, pytest.mark.shares_cluster]

# (the first checkpoint, at step 50, is where a signalled run waits for the test's signal: held_at_first_save)
LONG = ["--max-steps", "600", "--log-interval", "1", "--eval-interval", "100", "--ckpt-interval", "50",
        "--dropout", "0.1"]


def flags(corpus: Path, out: Path, data: Path, *extra: str) -> list[str]:
    return [*TINY_FLAGS, *LONG, "--data-file", str(corpus), "--out-dir", str(out), "--data-dir", str(data), *extra]


def spec_train(corpus: Path, data: Path) -> dict:
    """The same settings as `flags`, as a spec's `train:` mapping (the launcher sets out_dir)."""
    args = flags(corpus, Path("unused"), data)
    keys = {a.lstrip("-").replace("-", "_"): v for a, v in zip(args[::2], args[1::2])}
    keys.pop("out_dir")
    return keys


def test_signalled_sbatch_job_requeues_resumes_and_matches_an_uninterrupted_run(tmp_path, tiny_corpus):
    ref = reference(config.resolve(flags(tiny_corpus, tmp_path / "reference", tmp_path / "data")))
    out, gate = tmp_path / "job", tmp_path / "signalled"
    job = sbatch("hpc_lab/04_tinygpt/train.sbatch", *flags(tiny_corpus, out, tmp_path / "data"), cwd=ROOT,
                 env=job_env(**held_at_first_save(gate)))
    log = ROOT / "logs" / f"tinygpt-{job}.out"
    try:
        signal_when_training(job, out / "metrics.jsonl", gate=gate)
        state, restarts = run_to_completion(job)
        assert state == "COMPLETED" and restarts == 1, log.read_text()
    finally:
        cancel(job)
        log.unlink(missing_ok=True)
    preempted = events(out, "preempted")
    assert len(preempted) == 1 and "SIGUSR2" in preempted[0]["reason"]
    assert preempted[0]["requeue"] == f"requeued job {job}"
    assert [e["restarts"] for e in events(out, "start")] == [0, 1]
    assert loss_series(out) == loss_series(ref)  # bit-identical train and val losses


def test_two_nodes_signalled_resume_to_the_same_weights(tmp_path, tiny_corpus):
    jobs, gate = {}, tmp_path / "gate"
    for name in ("whole", "signalled"):
        script = f"#!/bin/bash\n#SBATCH --requeue\nsrun {python()} -m tinygpt.train " + " ".join(
            flags(tiny_corpus, tmp_path / name, tmp_path / "data")) + "\n"
        jobs[name] = sbatch("-J", unique_name(name), "-N", "2", "--ntasks-per-node", "1", "-o",
                            str(tmp_path / f"{name}.out"), "--open-mode=append", script=script,
                            env=job_env(**held_at_first_save(gate)) if name == "signalled" else job_env())
    try:
        signal_when_training(jobs["signalled"], tmp_path / "signalled" / "metrics.jsonl", gate=gate)
        assert run_to_completion(jobs["signalled"]) == ("COMPLETED", 1), (tmp_path / "signalled.out").read_text()
        assert run_to_completion(jobs["whole"]) == ("COMPLETED", 0), (tmp_path / "whole.out").read_text()
    finally:
        cancel(*jobs.values())
    whole, signalled = read_metrics(tmp_path / "whole"), read_metrics(tmp_path / "signalled")
    assert sorted(next(e for e in signalled if e.get("event") == "start")["hostnames"]) == ["node1", "node2"]
    digests = signalled[-1]["weights_digest"]
    assert digests[0] == digests[1] == whole[-1]["weights_digest"][0]
    assert loss_series(tmp_path / "signalled") == loss_series(tmp_path / "whole")


def time_limit_now(job: str, minutes: int | None = None) -> None:
    """Set the job's time limit: `minutes`, or one to two minutes past its run time so far."""
    if minutes is None:
        h, m, s = (int(x) for x in job_fields(job)["RunTime"].split("-")[-1].split(":"))
        minutes = (h * 3600 + m * 60 + s) // 60 + 2
    subprocess.run(["scontrol", "update", f"JobId={job}", f"TimeLimit={minutes}"], check=True, capture_output=True,
                   timeout=30)


@pytest.mark.slurm_release
def test_time_limit_requeues_and_completes_without_losing_or_repeating_a_step(tmp_path, tiny_corpus):
    """Slurm's own warning before the time limit stops the run, which requeues itself and finishes, every
    logged step once across its lives. slurmctld sends the warning at its periodic check (every 30 s), so a
    warning due at a fixed time after the start may come before the trainer has its handler, and be lost: the
    limit is brought near only once the trainer trains (its warning, 300 s before the end, then due at once), and
    put back for the next life. Whatever the machine's speed: the first life aims at a step count that no machine
    reaches before the warning, and once Slurm has stopped it, the test sets the real end in the run's config file
    (which every start reads). While it waits for the warning, the run spends most of its time in a checkpoint
    write held for half a second every 50 steps (tests/support/slow_saves), not on the CPU; the last life saves
    only at its end."""
    out = tmp_path / "limit"
    keys = spec_train(tiny_corpus, tmp_path / "data")
    keys.update(out_dir=str(out), max_steps=10**9, log_interval=50, eval_interval=3000, ckpt_interval=50)
    run_config = tmp_path / "limit.yaml"
    run_config.write_text(json.dumps(keys))
    script = f"#!/bin/bash\nsrun {python()} -m tinygpt.train --config {run_config}\n"
    job = sbatch("-J", unique_name("limit"), "--time=10", "--signal=USR2@300", "--requeue", "-o",
                 str(tmp_path / "limit.out"), "--open-mode=append", script=script, env=job_env(**slow_saves(0.5)))
    try:
        wait_until(lambda: training(out / "metrics.jsonl"), timeout=120, poll=0.2, what="the first life training")
        time_limit_now(job)
        preempted = wait_until(lambda: events(out, "preempted"), timeout=120, poll=0.2, what="the time-limit signal")
        time_limit_now(job, 10)  # (Slurm holds a requeued job a few seconds: the next life starts after this)
        final = (preempted[0]["step"] // 50 + 10) * 50  # ten more logged steps after the first life
        run_config.write_text(json.dumps({**keys, "max_steps": final, "ckpt_interval": 3000}))  # (no more waits)
        state, restarts = run_to_completion(job, timeout=420)
    finally:
        cancel(job)
    print(f"\ntime-limit job: {state} after {restarts} restart(s), stopped first at step {preempted[0]['step']}")
    assert state == "COMPLETED" and restarts == 1, (tmp_path / "limit.out").read_text()
    assert "SIGUSR2" in preempted[0]["reason"] and preempted[0]["requeue"].startswith("requeued job")
    steps = [r["step"] for r in read_metrics(out) if "lr" in r]
    assert steps == list(range(50, final + 1, 50))  # every logged step exactly once, across every life
    assert len(events(out, "preempted")) == 1


@pytest.mark.slurm_release
def test_submitit_job_is_checkpointed_and_requeued_by_submitit(tmp_path, tiny_corpus):
    ref = reference(config.resolve(flags(tiny_corpus, tmp_path / "reference", tmp_path / "data")))
    workdir = tmp_path / "w"
    spec = tmp_path / "subpre.yaml"
    spec.write_text(json.dumps({"name": "subpre", "backend": "submitit",
                                "train": spec_train(tiny_corpus, tmp_path / "data"),
                                "resources": {"time": "00:10:00"}}))
    gate = tmp_path / "gate"
    manifest = launched(spec, workdir, env=held_at_first_save(gate))
    job = manifest.task_job_ids()[0]
    run_dir = Path(manifest.runs[0].out_dir)
    try:
        signal_when_training(job, run_dir / "metrics.jsonl", gate=gate)
        state, restarts = run_to_completion(job)
    finally:
        cancel(job)
    logs = "\n".join(p.read_text() for p in sweep_dirs(workdir, "subpre").submitit.glob("*_log.*"))
    assert state == "COMPLETED" and restarts == 1, logs
    assert "Exiting gracefully after preemption/timeout" in logs  # submitit's own requeue path
    preempted = events(run_dir, "preempted")
    assert preempted and preempted[0]["requeue"] == "handed over to the launcher's requeue mechanism"
    assert loss_series(run_dir) == loss_series(ref)


@pytest.mark.slurm_release
def test_one_signalled_array_task_requeues_alone(tmp_path, tiny_corpus):
    ref = reference(config.resolve(flags(tiny_corpus, tmp_path / "reference", tmp_path / "data", "--lr", "0.003")))
    workdir = tmp_path / "w"
    spec = tmp_path / "arr.yaml"
    spec.write_text(json.dumps({"name": "arr", "train": spec_train(tiny_corpus, tmp_path / "data"),
                                "grid": {"lr": [0.002, 0.003]}, "resources": {"time": "00:10:00"}}))
    gate = tmp_path / "gate"  # (both runs wait at their first checkpoint until the signal has gone)
    manifest = launched(spec, workdir, env=held_at_first_save(gate))
    ids = manifest.task_job_ids()
    runs = {r.name: Path(r.out_dir) for r in manifest.runs}
    try:
        signal_when_training(ids[1], runs["lr-0.003"] / "metrics.jsonl", gate=gate)
        results = {i: run_to_completion(j) for i, j in ids.items()}
    finally:
        cancel(*ids.values())
    assert results == {0: ("COMPLETED", 0), 1: ("COMPLETED", 1)}
    assert [e["restarts"] for e in events(runs["lr-0.003"], "start")] == [0, 1]
    assert [e["event"] for e in events(runs["lr-0.002"])] == ["start", "finished"]
    assert loss_series(runs["lr-0.003"]) == loss_series(ref)
