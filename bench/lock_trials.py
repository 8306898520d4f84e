"""Trials of the run-directory lock (tinygpt/training/rundir_lock.py) with real trainers; prints one JSON line per
trial and a summary. Not a test: it takes minutes (the tests try each case once).

    python bench/lock_trials.py                      # 20 trials: two trainers on one directory, this machine
    python bench/lock_trials.py --slurm              # ... one on each node of the local cluster (node1, node2)
    python bench/lock_trials.py --kill               # 20 trials: SIGKILL a trainer, restart at once on its directory

Two trainers: the second starts after a random offset (0-3 s, so sometimes before the first has even
imported torch); a trial passes when exactly one trainer finishes, the other refuses with the holder's
name, and the finished run's metrics hold each step once. Kill: a trial passes when the restart, started
at once, finishes with each step once (a lock left by the dead trainer would make it refuse); `resumed`
says whether the killed life had reached its first checkpoint (every 100 steps).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT
from tinygpt.training import metrics

TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16", "--batch-size", "4",
        "--eval-interval", "100000", "--ckpt-interval", "100", "--log-interval", "1", "--sample-tokens", "0",
        "--progress", "plain", "--threads", "1", "--dataset", "pydoc"]
ENV = {"PYTHONPATH": str(ROOT), "TINYGPT_OFFLINE": "1"}


def trainer_cmd(out: Path, steps: int) -> list[str]:
    return [sys.executable, "-m", "tinygpt.train", *TINY, "--max-steps", str(steps), "--out-dir", str(out),
            "--data-dir", str(out.parent / "data")]


def steps_once(out: Path) -> bool:
    steps = [r["step"] for r in metrics.read(metrics.of_run(out)) if "lr" in r]
    return steps == sorted(set(steps)) and len(steps) > 0


def two_here(tmp: Path, trial: int, rng: random.Random) -> dict:
    import os

    out = tmp / f"run{trial}"
    env = {**os.environ, **ENV}
    first = subprocess.Popen(trainer_cmd(out, 1500), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
    offset = rng.uniform(0, 3)
    time.sleep(offset)
    second = subprocess.Popen(trainer_cmd(out, 1500), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env)
    results = [(p.wait(timeout=600), p.communicate()[1]) for p in (first, second)]
    codes = sorted(code for code, _ in results)
    refused = [err for code, err in results if code == 1]
    ok = codes == [0, 1] and "is in use by another trainer" in refused[0] and steps_once(out)
    return {"trial": trial, "offset_s": round(offset, 2), "exit_codes": [c for c, _ in results], "ok": ok}


def two_on_nodes(tmp: Path, trial: int, rng: random.Random) -> dict:
    import os

    out = tmp / f"run{trial}"
    script = f"#!/bin/bash\nsrun {' '.join(trainer_cmd(out, 1500))}\n"
    env = {**os.environ, **ENV}
    jobs = []
    for node in ("node1", "node2"):
        done = subprocess.run(["sbatch", "--parsable", "-w", node, "-o", str(tmp / f"{trial}-{node}.out")],
                              input=script, capture_output=True, text=True, env=env, check=True)
        jobs.append(done.stdout.strip())
        offset = rng.uniform(0, 3) if node == "node1" else 0
        time.sleep(offset)
    states = [wait_job(job) for job in jobs]
    logs = [(tmp / f"{trial}-{node}.out").read_text() for node in ("node1", "node2")]
    refused = [log for log, state in zip(logs, states) if state == "FAILED"]
    ok = sorted(states) == ["COMPLETED", "FAILED"] and "is in use by another trainer" in refused[0] and steps_once(out)
    return {"trial": trial, "states": states, "ok": ok}


def wait_job(job: str, timeout: float = 600) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True).stdout
        state = next((f.split("=", 1)[1] for f in out.split() if f.startswith("JobState=")), "")
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            return state
        time.sleep(0.5)
    subprocess.run(["scancel", job])
    return "TIMEOUT(bench)"


def kill_and_restart(tmp: Path, trial: int, rng: random.Random) -> dict:
    import os

    out = tmp / f"run{trial}"
    env = {**os.environ, **ENV}
    first = subprocess.Popen(trainer_cmd(out, 100000), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    while not (metrics.of_run(out).exists() and '"lr"' in metrics.of_run(out).read_text()):
        time.sleep(0.05)
    time.sleep(rng.uniform(0, 1))
    first.kill()
    first.wait()
    t0 = time.monotonic()
    again = subprocess.run(trainer_cmd(out, 300), capture_output=True, text=True, env=env, timeout=600)
    events = [r.get("event") for r in metrics.read(metrics.of_run(out))]
    # (killed before its first checkpoint, a run starts afresh, and its metrics with it: one start)
    ok = again.returncode == 0 and events[-1] == "finished" and steps_once(out)
    return {"trial": trial, "restart_exit_code": again.returncode, "resumed": events.count("start") == 2,
            "restart_to_finish_s": round(time.monotonic() - t0, 1), "ok": ok}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--slurm", action="store_true", help="one trainer on each node of the local cluster")
    parser.add_argument("--kill", action="store_true", help="SIGKILL, then restart on the same directory")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    trial = kill_and_restart if args.kill else two_on_nodes if args.slurm else two_here
    rng = random.Random(args.seed)
    results = []
    with tempfile.TemporaryDirectory(prefix="tinygpt-lock-") as tmp:
        for i in range(args.trials):
            results.append(trial(Path(tmp), i, rng))
            print(json.dumps(results[-1]), flush=True)
    print(json.dumps({"mode": trial.__name__, "trials": len(results), "passed": sum(r["ok"] for r in results)}))


if __name__ == "__main__":
    main()
