"""Trials of the jobs that must not hang silently, on the two-node local cluster; prints a table.

    python bench/hang_trials.py             # 3 stopped ranks and 3 unreachable master addresses
    python bench/hang_trials.py --trials 5  # ... 5 of each

A stopped rank: SIGSTOP to rank 0, 1, 0, ... of a two-node run after a drawn number of training lines;
the watchdog (hang_timeout 5 s) must end the job. An unreachable master: MASTER_ADDR set to an address of
the cluster's own subnet that no node has (10.77.0.9x); the join (join_timeout 15 s) must end the job. Each
faulty run is then resubmitted (`launch.py resubmit`, without the bad address) and must finish with the
weights of the same run left alone: `lost` counts the runs that did not. Seconds are measured from the
fault (the SIGSTOP, or the job's start) to the end of the job as Slurm records it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, trial_options
from tests.support.slurm import trainer_pid
from tinygpt.launch import manifest
from tinygpt.launch.layout import SweepDirs, task_log
from tinygpt.training import metrics

TRAIN = {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16, "batch_size": 4, "max_steps": 2000,
         "eval_interval": 500, "ckpt_interval": 50, "log_interval": 10, "sample_tokens": 0, "eval_windows": 8,
         "threads": 1, "dataset": "pydoc", "hang_timeout": 5, "join_timeout": 15}


def launch(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "launch.py"), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), "TINYGPT_OFFLINE": "1",
                                                      **env})


def sweep(work: Path, name: str, **env: str) -> str:
    spec = work / f"{name}.yaml"
    spec.write_text(json.dumps({"name": name, "train": TRAIN, "resources": {"nodes": 2, "tasks_per_node": 1,
                                                                           "time": "00:10:00"}}))
    out = launch(str(spec), "--workdir", str(work), **env)
    if out.returncode != 0:
        raise SystemExit(out.stdout + out.stderr)
    return task_of(work, name)


def task_of(work: Path, name: str) -> str:
    sub = manifest.load(SweepDirs(work, name).manifest).submissions[-1]
    return f"{sub.job_id}_{sub.array.split(',')[0].split('-')[0]}"


def ended(task: str, timeout: float = 300) -> tuple[str, float]:
    """(state, end time as a Unix time) once sacct says the job ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", task, "-o", "State,End"], capture_output=True,
                             text=True, timeout=30).stdout.split()
        if out and out[0].split("|")[0] not in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING", "CONFIGURING"):
            state, end = out[0].split("|")[:2]
            return state.split()[0], time.mktime(time.strptime(end, "%Y-%m-%dT%H:%M:%S"))
        time.sleep(0.5)
    raise SystemExit(f"job {task} did not end within {timeout} s")


def started(task: str) -> float:
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", task, "-o", "Start"], capture_output=True, text=True,
                         timeout=30).stdout.split()
    return time.mktime(time.strptime(out[0], "%Y-%m-%dT%H:%M:%S"))


def final_digest(work: Path, name: str) -> list | None:
    records = metrics.read(metrics.of_run(SweepDirs(work, name).run("base")))
    return records[-1].get("weights_digest") if records and records[-1].get("event") == "finished" else None


def resubmit_and_finish(work: Path, name: str) -> list | None:
    out = launch("resubmit", str(work / f"{name}.yaml"), "--workdir", str(work))
    if out.returncode != 0 or "resubmitting 1" not in out.stdout:
        print(out.stdout + out.stderr, file=sys.stderr)
        return None
    ended(task_of(work, name))
    return final_digest(work, name)


def stopped_rank(work: Path, trial: int, rng: random.Random, reference: list) -> dict:
    name = f"stop{trial}"
    task = sweep(work, name)
    rank, lines = trial % 2, rng.randint(3, 150)  # (of 200; rank 0 holds the rendezvous store: the harder case)
    pid = trainer_pid(task, rank)
    log = metrics.of_run(SweepDirs(work, name).run("base"))
    while not (log.exists() and log.read_text().count('"lr"') >= lines):
        time.sleep(0.05)
    os.kill(pid, signal.SIGSTOP)
    fault = time.time()
    state, end = ended(task)
    record = metrics.read(log)[-1]
    digest = resubmit_and_finish(work, name)
    return {"fault": f"SIGSTOP rank {rank} after {lines} lines", "state": state, "seconds": round(end - fault),
            "hung record": record.get("event") == "hung", "lost": int(digest is None),
            "same weights": digest == reference}


def unreachable_master(work: Path, trial: int, reference: list) -> dict:
    name, address = f"master{trial}", f"10.77.0.{99 - trial}"
    task = sweep(work, name, MASTER_ADDR=address)
    state, end = ended(task)
    log = task_log(SweepDirs(work, name).logs, task).read_text(errors="replace")
    digest = resubmit_and_finish(work, name)
    return {"fault": f"MASTER_ADDR={address}", "state": state, "seconds": round(end - started(task)),
            "hung record": f"could not reach the master at {address}" in log, "lost": int(digest is None),
            "same weights": digest == reference}


def main() -> int:
    args, rng = trial_options(__doc__)
    with tempfile.TemporaryDirectory(prefix="hang-trials-") as tmp:
        work = Path(tmp)
        ended(sweep(work, "steady"))
        reference = final_digest(work, "steady")
        rows = [stopped_rank(work, t, rng, reference) for t in range(args.trials)]
        rows += [unreachable_master(work, t, reference) for t in range(args.trials)]
    print(f"{'fault':<32} {'job ended':<10} {'s to end':>8}  {'said why':<8} {'lost':>4}  same weights after resubmit")
    for r in rows:
        print(f"{r['fault']:<32} {r['state']:<10} {r['seconds']:>8}  {str(r['hung record']):<8} {r['lost']:>4}  "
              f"{r['same weights']}")
    print(f"runs lost: {sum(r['lost'] for r in rows)}; runs with other weights: "
          f"{sum(not r['same weights'] for r in rows)}")
    return 0 if all(r["same weights"] and not r["lost"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
