"""Trials of Slurm's daemons as they fail on real clusters, on the two-node local cluster (`up.sh --nodes
2 --preemption`): the controller stopped and started again, accounting (slurmdbd) and its database (MariaDB)
stopped, each the way a site's restart does (hpc_lab/local_cluster/daemon.sh); prints two tables.

    python bench/controller_trials.py

Commands: each command of launch.py while a daemon is away, and again once it is back: its exit status (75: try
again), how long it took, its first words. Runs: a two-run sweep whose controller stops just as its tasks start
their training steps (srun cannot reach it), is started again 20 s later; and a run requeued (`scontrol requeue`)
whose controller restarts at that moment. `lost`: runs that never finished; `same`: the final weights equal
those of the same run left alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT
from tests.support.slurm import run_to_completion, wait
from tinygpt.launch.layout import SweepDirs
from tinygpt.training import metrics

DAEMON = ROOT / "hpc_lab" / "local_cluster" / "daemon.sh"
TRAIN = {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16, "batch_size": 4, "max_steps": 300,
         "eval_interval": 100, "ckpt_interval": 50, "log_interval": 10, "sample_tokens": 0, "eval_windows": 8,
         "threads": 1, "dataset": "pydoc"}


def launch(*args: str) -> tuple[int, float, str]:
    start = time.monotonic()
    out = subprocess.run([sys.executable, str(ROOT / "launch.py"), *args], capture_output=True, text=True, cwd=ROOT,
                         timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), "TINYGPT_OFFLINE": "1"})
    said = (out.stderr.strip() or out.stdout.strip()).splitlines()
    note = next((line for line in out.stdout.splitlines() if line.startswith("note:")), "")
    return out.returncode, time.monotonic() - start, (note or (said[0] if said else ""))[:110]


def daemon(action: str, name: str) -> None:
    subprocess.run(["bash", str(DAEMON), action, name], check=True, capture_output=True, timeout=120)


def write_spec(work: Path, name: str, runs: int = 1, setup_waits_for: Path | None = None) -> Path:
    spec = {"name": name, "train": TRAIN, "resources": {"time": "00:10:00"}, "grid": {"seed": list(range(1, runs + 1))}}
    if setup_waits_for:
        profile = work / f"{name}-site.yaml"
        profile.write_text((ROOT / "hpc_lab" / "clusters" / "local.yaml").read_text()
                           + f"setup: [\"while [ ! -e '{setup_waits_for}' ]; do sleep 0.2; done\"]\n")
        spec["cluster"] = str(profile)
    path = work / f"{name}.yaml"
    path.write_text(json.dumps(spec))
    return path


def commands(work: Path) -> list[dict]:
    held, fresh = write_spec(work, "held"), write_spec(work, "fresh")
    assert launch(str(held), "--hold", "--workdir", str(work))[0] == 0
    asked = {"launch (new sweep)": [str(fresh)], "launch --no-check": [str(fresh), "--no-check"],
             "check": ["check", str(fresh)], "launch (live sweep)": [str(held)], "status": ["status", str(held)],
             "status --efficiency": ["status", str(held), "--efficiency"], "cancel": ["cancel", str(held)],
             "resubmit --dry-run": ["resubmit", str(held), "--dry-run"]}
    rows = []
    for away, names in (("slurmctld", ["launch (new sweep)", "launch --no-check", "check", "launch (live sweep)",
                                       "status", "cancel", "resubmit --dry-run"]),
                        ("slurmdbd", ["status", "status --efficiency", "resubmit --dry-run"]),
                        ("mariadb", ["status", "status --efficiency", "resubmit --dry-run"])):
        daemon("stop", away)
        try:
            for name in names:
                code, seconds, said = launch(*asked[name], "--workdir", str(work))
                rows.append({"away": away, "command": name, "exit": code, "s": seconds, "said": said})
        finally:
            daemon("start", away)
        for name in names[-2:]:  # (once it is back)
            code, seconds, said = launch(*asked[name], "--workdir", str(work))
            rows.append({"away": f"{away} back", "command": name, "exit": code, "s": seconds, "said": said})
    launch("cancel", str(held), "--workdir", str(work))
    return rows


def final(work: Path, name: str, run: str) -> tuple[str | None, float | None]:
    records = metrics.read(metrics.of_run(SweepDirs(work, name).run(run)))
    last = records[-1] if records else {}
    vals = [r["val_loss"] for r in records if r.get("val_loss") is not None]
    return (last.get("weights_digest") if last.get("event") == "finished" else None), (vals[-1] if vals else None)


def tasks(work: Path, name: str) -> list[str]:
    from tinygpt.launch import manifest

    ids = manifest.load(SweepDirs(work, name).manifest).task_job_ids()
    return [ids[i] for i in sorted(ids)]


def runs(work: Path) -> list[dict]:
    alone = write_spec(work, "alone", runs=2)
    assert launch(str(alone), "--workdir", str(work))[0] == 0
    for task in tasks(work, "alone"):
        wait(task)
    rows = []
    go = work / "go"
    spec = write_spec(work, "restart", runs=2, setup_waits_for=go)
    assert launch(str(spec), "--workdir", str(work))[0] == 0
    for task in tasks(work, "restart"):
        while subprocess.run(["squeue", "-h", "-j", task, "-o", "%T"], capture_output=True, text=True,
                             timeout=30).stdout.strip() != "RUNNING":
            time.sleep(0.5)
    daemon("stop", "slurmctld")
    go.touch()
    time.sleep(20)
    daemon("start", "slurmctld")
    states = [wait(task, timeout=600) for task in tasks(work, "restart")]
    for i, run in enumerate(("seed-1", "seed-2")):
        digest, val = final(work, "restart", run)
        rows.append({"case": "controller away as the step starts (20 s)", "run": run, "slurm": states[i],
                     "lost": int(digest is None), "same": digest == final(work, "alone", run)[0], "val": val})
    requeued = write_spec(work, "requeued")
    assert launch(str(requeued), "--workdir", str(work))[0] == 0
    [task] = tasks(work, "requeued")
    run_dir = SweepDirs(work, "requeued").run("seed-1")
    while not (metrics.of_run(run_dir).exists() and metrics.of_run(run_dir).read_text().count('"lr"') >= 8):
        time.sleep(0.1)
    subprocess.run(["scontrol", "requeue", task], check=True, capture_output=True, timeout=30)
    daemon("restart", "slurmctld")
    state, restarts = run_to_completion(task, timeout=600)
    digest, val = final(work, "requeued", "seed-1")
    rows.append({"case": "controller restarted as the job is requeued", "run": "seed-1",
                 "slurm": f"{state} after {restarts} restart(s)", "lost": int(digest is None),
                 "same": digest == final(work, "alone", "seed-1")[0], "val": val})
    return rows


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="controller-trials-") as tmp:
        work = Path(tmp)
        print("| daemon | command | exit | s | said |\n| --- | --- | --- | --- | --- |")
        for r in commands(work):
            print(f"| {r['away']} | {r['command']} | {r['exit']} | {r['s']:.2f} | {r['said']} |")
        print("\n| case | run | Slurm | lost | same | final val |\n| --- | --- | --- | --- | --- | --- |")
        for r in runs(work):
            print(f"| {r['case']} | {r['run']} | {r['slurm']} | {r['lost']} | {r['same']} | {r['val']} |")


if __name__ == "__main__":
    main()
