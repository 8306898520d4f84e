"""Trials of jobs lost the ways Slurm loses them, on the two-node local cluster with its preemption
partitions (`up.sh --nodes 2 --preemption`); prints a table.

    python bench/lost_jobs_trials.py              # 3 trials of each case
    python bench/lost_jobs_trials.py --trials 1   # ... 1 of each

Cases, each at a drawn moment (a number of training lines, or of lock acquisitions; --seed):
- requeue: a run in partition `low` (PreemptMode=REQUEUE) loses its node to a job of partition `high`;
  Slurm requeues it and it must finish by itself.
- cancel: the same in `low-cancel` (PreemptMode=CANCEL): the run ends PREEMPTED; `launch.py resubmit`
  (no options) must send it back.
- node loss: node2 of a two-node run crashes (`node.sh crash`: SIGKILL to its slurmd and every process in
  its namespace); Slurm ends the job NODE_FAIL and requeues it, the node boots again, the run must finish.
- lock kill: an Optuna search of 6 trials on two workers; the worker that holds a lock at its drawn
  acquisition (the journal's own lock in even trials, the one taken to ask for a trial in odd ones) is
  SIGKILLed there (tests/support/slow_locks holds every lock 0.3 s, so the kill lands inside);
  the other worker must go on once the lock's grace period is over, and a plain `resubmit` must let the
  killed worker finish the trial it had.

`lost`: runs that never finished (trials for the search: not COMPLETE). `same`: the final weights equal
those of the same run left alone (the search: every trial's best validation loss equals that of its
settings trained alone). `s` is the wait the fault caused: preemption, from the high-priority job's
submission to the start of the run's next life (for cancel, that includes the resubmission); node loss,
from the crash to Slurm queueing the job again; lock kill, from the kill to the other worker taking the
same lock over ("-": it never wanted it again).
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
from tests.support.slurm import job_fields, run_to_completion, sbatch, wait
from tinygpt.launch.layout import SweepDirs
from tinygpt.training import metrics

TRAIN = {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16, "batch_size": 4, "max_steps": 1500,
         "eval_interval": 500, "ckpt_interval": 50, "log_interval": 10, "sample_tokens": 0, "eval_windows": 8,
         "threads": 1, "dataset": "pydoc", "dropout": 0.1}
NODE_SH = ROOT / "hpc_lab" / "local_cluster" / "node.sh"


def launch(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "launch.py"), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), "TINYGPT_OFFLINE": "1",
                                                      **env})


def sweep(work: Path, name: str, resources: dict, train: dict | None = None, search: dict | None = None,
          **env: str) -> list[str]:
    """Launch a one-run sweep (or a search); its array tasks' job ids."""
    spec = {"name": name, "train": train or TRAIN, "resources": {"time": "00:10:00", **resources}}
    if search:
        spec["search"] = search
    (work / f"{name}.yaml").write_text(json.dumps(spec))
    out = launch(str(work / f"{name}.yaml"), "--workdir", str(work), **env)
    if out.returncode != 0:
        raise SystemExit(out.stdout + out.stderr)
    return tasks_of(work, name)


def tasks_of(work: Path, name: str) -> list[str]:
    from tinygpt.launch import manifest

    ids = manifest.load(SweepDirs(work, name).manifest).task_job_ids()
    return [ids[i] for i in sorted(ids)]


def lines_at_least(path: Path, lines: int) -> None:
    while not (path.exists() and path.read_text().count('"lr"') >= lines):
        time.sleep(0.05)


def digest(work: Path, name: str) -> list | None:
    records = metrics.read(metrics.of_run(SweepDirs(work, name).run("base")))
    return records[-1].get("weights_digest") if records and records[-1].get("event") == "finished" else None


def lives(task: str) -> str:
    out = subprocess.run(["sacct", "-X", "-D", "-n", "-P", "-j", task.split("_")[0], "-o", "State"],
                         capture_output=True, text=True, timeout=30).stdout.split()
    return ">".join(out)


def last_start(task: str) -> float:
    """When the latest life of a job started, as a Unix time."""
    out = subprocess.run(["sacct", "-X", "-D", "-n", "-P", "-j", task.split("_")[0], "-o", "Start"],
                         capture_output=True, text=True, timeout=30).stdout.split()
    return time.mktime(time.strptime(max(out), "%Y-%m-%dT%H:%M:%S"))


def resubmit(work: Path, name: str) -> bool:
    out = launch("resubmit", str(work / f"{name}.yaml"), "--workdir", str(work))
    if out.returncode != 0 or "resubmitting" not in out.stdout:
        print(out.stdout + out.stderr, file=sys.stderr)
        return False
    return True


def take_every_node() -> str:
    return sbatch("-p", "high", "-N", "2", "--ntasks-per-node", "1", "-c", "2", "-J", "lost-trials-high",
                  "-o", "/dev/null", "--wrap", "sleep 1")


def preempted(work: Path, trial: int, rng: random.Random, mode: str, reference: list) -> dict:
    name, lines = f"{mode}{trial}", rng.randint(3, 120)  # (of 150 training lines)
    [task] = sweep(work, name, {"partition": "low" if mode == "requeue" else "low-cancel", "cpus_per_task": 2})
    lines_at_least(metrics.of_run(SweepDirs(work, name).run("base")), lines)
    fault = time.time()
    high = take_every_node()
    if mode == "requeue":
        run_to_completion(task)
    else:
        wait(task)
        if resubmit(work, name):
            wait(tasks_of(work, name)[0])
    wait(high)
    stop = next((r for r in metrics.read(metrics.of_run(SweepDirs(work, name).run("base")))
                 if r.get("event") == "preempted"), {})
    seconds = round(last_start(tasks_of(work, name)[0]) - fault)
    final = digest(work, name)
    return {"case": mode, "moment": f"after {lines} lines (step {stop.get('step', '?')})",
            "slurm": lives(task) + ("" if mode == "requeue" else f", then {lives(tasks_of(work, name)[0])}"),
            "seconds": seconds, "lost": int(final is None), "same": final == reference}


def node_loss(work: Path, trial: int, rng: random.Random, reference: list) -> dict:
    name, lines = f"node{trial}", rng.randint(6, 120)  # (past the first checkpoint, at step 50)
    [task] = sweep(work, name, {"nodes": 2, "tasks_per_node": 1})
    lines_at_least(metrics.of_run(SweepDirs(work, name).run("base")), lines)
    subprocess.run(["bash", str(NODE_SH), "crash", "node2"], check=True, capture_output=True, timeout=60)
    fault = time.monotonic()
    while job_fields(task).get("Restarts", "0") == "0":  # NODE_FAIL, and Slurm queues the job again
        time.sleep(0.2)
    seconds = round(time.monotonic() - fault)
    subprocess.run(["bash", str(NODE_SH), "boot", "node2"], check=True, capture_output=True, timeout=60)
    run_to_completion(task)
    final = digest(work, name)
    return {"case": "node loss", "moment": f"after {lines} lines", "slurm": lives(task), "seconds": seconds,
            "lost": int(final is None), "same": final == reference}


SEARCH = {"method": "optuna", "trials": 6, "workers": 2, "sampler": "random", "pruner": "none",
          "params": {"lr": {"loguniform": [1.0e-3, 1.0e-2]}}}


def identity(path: Path) -> tuple[int, int] | None:
    """A file's (inode, modification time), None when there is none: a lock file made anew differs."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def lock_kill(work: Path, trial: int, rng: random.Random) -> dict:
    import optuna

    from tinygpt.base import config
    from tinygpt.launch import manifest as manifest_mod
    from tinygpt.launch.node import study_journal
    from tinygpt.training import trainer

    name, nth = f"lock{trial}", rng.randint(2, 12)
    train = {**TRAIN, "max_steps": 300, "eval_interval": 100}
    env = {"PYTHONPATH": f"{ROOT / 'tests' / 'support' / 'slow_locks'}{os.pathsep}{ROOT}",
           "TINYGPT_TEST_LOCK_STALL_S": "0.3"}
    tasks = sweep(work, name, {}, train=train, search={**SEARCH, "seed": trial}, **env)
    manifest = manifest_mod.load(SweepDirs(work, name).manifest)
    journal = Path(manifest.search.journal)
    # Each lock taken shows its holder's pid for 0.3 s: the journal's lock in even trials, the asking lock in
    # odd ones.
    lock = Path(f"{journal}.lock.holder") if trial % 2 == 0 else Path(f"{journal}.asking.lock.holder")
    seen, pid, held = 0, None, None
    while seen < nth:
        try:
            now = lock.read_text()
        except OSError:
            now = ""
        if now and (lock, now) != held:
            seen, held, pid = seen + 1, (lock, now), int(now)
        elif not now:
            held = None  # (released: the same worker taking it again counts again)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    fault = time.monotonic()
    lock_file = Path(str(held[0]).removesuffix(".holder"))
    stale = identity(lock_file)  # the file the dead holder left
    seconds: int | str = "-"  # (the lock was never wanted again)
    asked = 0.0
    while True:
        if identity(lock_file) != stale:  # broken by a waiter after the grace period (and maybe taken again)
            seconds = round(time.monotonic() - fault)
            break
        if time.monotonic() - asked > 2:  # (scontrol now and then: the takeover is what is timed)
            if not any(job_fields(t).get("JobState") == "RUNNING" for t in tasks):
                break
            asked = time.monotonic()
        time.sleep(0.02)
    states = [wait(t) for t in tasks]
    if "FAILED" in states:
        resubmit(work, name)
        for t in tasks_of(work, name):
            wait(t)
    study = optuna.load_study(study_name=name, storage=study_journal.storage(str(journal)))
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    same = True
    for t in done:  # each trial's settings, trained alone
        cfg = config.build({**manifest.base, **t.params, "progress": "off",
                            "out_dir": str(work / "alone" / name / str(t.number))})
        same = same and trainer.train(cfg).best_val_loss == t.value
    return {"case": "lock kill", "moment": f"lock taken #{nth} ({held[0].name.removesuffix('.holder')})",
            "slurm": ",".join(states), "seconds": seconds, "lost": SEARCH["trials"] - len(done), "same": same}


def main() -> int:
    args, rng = trial_options(__doc__, ("requeue", "cancel", "node", "lock"))
    with tempfile.TemporaryDirectory(prefix="lost-jobs-trials-") as tmp:
        work = Path(tmp)
        one_node = two_nodes = None
        if {"requeue", "cancel"} & set(args.cases):
            wait(sweep(work, "alone1", {"cpus_per_task": 2})[0])
            one_node = digest(work, "alone1")
        if "node" in args.cases:
            wait(sweep(work, "alone2", {"nodes": 2, "tasks_per_node": 1})[0])
            two_nodes = digest(work, "alone2")
        trials = {"requeue": lambda t: preempted(work, t, rng, "requeue", one_node),
                  "cancel": lambda t: preempted(work, t, rng, "cancel", one_node),
                  "node": lambda t: node_loss(work, t, rng, two_nodes), "lock": lambda t: lock_kill(work, t, rng)}
        rows = [trials[case](t) for case in args.cases for t in range(args.trials)]
    print(f"{'case':<10} {'moment':<44} {'Slurm (each life)':<26} {'s':>3} {'lost':>4}  same as left alone")
    for r in rows:
        print(f"{r['case']:<10} {r['moment']:<44} {r['slurm']:<26} {r['seconds']!s:>3} {r['lost']:>4}  {r['same']}")
    print(f"lost: {sum(r['lost'] for r in rows)}; not the same as left alone: {sum(not r['same'] for r in rows)}")
    return 0 if all(r["same"] and not r["lost"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
