"""What waves cost a launch: `launch.py check` of a 10,000-run sweep on the local cluster, with the tests' QOS
`waves` capped at MaxSubmitJobsPerUser=500 and without a cap, side by side (the same spec; the cap is put back
after). Prints each check's wall time, the ratio, and what the capped one says of its waves.

    python bench/waves.py [--runs 10000] [--limit 500] [--repeat 3]

With --launch, a sweep of that many one-second runs is launched for real under the cap and followed to its end,
unattended (with --add N, launched again with N more points while its waves are fed): the most of the user's
jobs in the QOS at once (squeue, every second), the waves it went out in, how long it took, and whether each run
went out once and its task COMPLETED (sacct).

    python bench/waves.py --launch --runs 64 --limit 8 [--add 10]

Needs the local cluster with accounts (hpc_lab/local_cluster/up.sh --accounts).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def check(spec: Path, work: Path) -> tuple[float, str]:
    started = time.perf_counter()
    out = subprocess.run([sys.executable, str(ROOT / "launch.py"), "check", str(spec), "--workdir", str(work)],
                         capture_output=True, text=True, timeout=600)
    spent = time.perf_counter() - started
    if out.returncode != 0:
        raise SystemExit(f"check failed:\n{out.stdout}\n{out.stderr}")
    return spent, next((line for line in out.stdout.splitlines() if line.startswith("waves:")), "(all at once)")


def qos_limit(value: int) -> None:
    subprocess.run(["sacctmgr", "-i", "modify", "qos", "waves", "set", f"MaxSubmitJobsPerUser={value}"], check=True,
                   capture_output=True, timeout=30)


def write_spec(folder: Path, runs: int, argv: list[str]) -> Path:
    spec = folder / "big.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "big", "grid": {"i": list(range(runs))}, "resources": {"time": "00:05:00", "qos": "waves"},
        "command": {"project": str(ROOT / "tests/support/foreign"), "argv": argv}}))
    return spec


def queued_in_qos() -> int | None:
    out = subprocess.run(["squeue", "-h", "-r", "--me", "-q", "waves", "-o", "%i"], capture_output=True, text=True,
                         timeout=30)
    return len(out.stdout.split()) if out.returncode == 0 else None


def accounted(tasks: list[str], timeout: float = 120.0) -> dict[str, str]:
    """sacct's state of each task, once it knows every one (accounting hears of an end after the controller)."""
    arrays = ",".join(sorted({t.split("_")[0] for t in tasks}))
    deadline = time.monotonic() + timeout
    while True:
        out = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", arrays], capture_output=True,
                             text=True, check=True, timeout=60).stdout
        states = dict(line.split("|")[:2] for line in out.splitlines() if line)
        if all(t in states for t in tasks) or time.monotonic() > deadline:
            return states
        time.sleep(1)


def launched(runs: int, limit: int, added: int) -> dict:
    """A sweep of `runs` one-second runs launched under the cap (and launched again with `added` more points while
    its waves are fed) and followed to its end."""
    sys.path.insert(0, str(ROOT))
    from tinygpt.launch import api

    with tempfile.TemporaryDirectory() as folder:
        spec = write_spec(Path(folder), runs, ["/bin/sh", "-c", "sleep 1; echo run {i}"])
        qos_limit(limit)
        try:
            started, peak = time.monotonic(), 0
            with contextlib.redirect_stdout(sys.stderr):  # (what the launch prints along the way)
                sweep = api.launch(spec, Path(folder) / "w")
                if added:
                    spec = write_spec(Path(folder), runs + added, ["/bin/sh", "-c", "sleep 1; echo run {i}"])
                    api.launch(spec, Path(folder) / "w")
            while not sweep.status().ended:
                peak = max(peak, queued_in_qos() or 0)
                time.sleep(1)
            spent = time.monotonic() - started
        finally:
            qos_limit(-1)
        manifest = sweep.reload()
        named = sorted(i for s in manifest.slurm_submissions() for i in s.indices)
        tasks = list(manifest.task_job_ids().values())
        states = accounted(tasks)
        return {"runs": runs + added, "limit": limit, "most_queued_at_once": peak, "wall_s": round(spent, 1),
                "waves": [len(s.indices) for s in manifest.submissions if s.indices],
                "added_while_fed": added, "each_run_sent_once": named == list(range(runs + added)),
                "tasks_completed": sum(states.get(t) == "COMPLETED" for t in tasks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--limit", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--launch", action="store_true", help="launch the sweep for real under the cap")
    parser.add_argument("--add", type=int, default=0, help="with --launch: launch it again with this many more "
                                                             "points while its waves are fed")
    args = parser.parse_args()
    if args.launch:
        print(json.dumps(launched(args.runs, args.limit, args.add), indent=1))
        return
    with tempfile.TemporaryDirectory() as folder:
        spec = write_spec(Path(folder), args.runs, ["/bin/sh", "-c", "echo {i}"])
        times: dict[str, list[float]] = {"no limit": [], f"limit {args.limit}": []}
        said = ""
        try:
            for _ in range(args.repeat):  # (interleaved, so that both see the same machine)
                qos_limit(-1)
                times["no limit"].append(check(spec, Path(folder) / "w")[0])
                qos_limit(args.limit)
                spent, said = check(spec, Path(folder) / "w")
                times[f"limit {args.limit}"].append(spent)
        finally:
            qos_limit(-1)
    medians = {k: statistics.median(v) for k, v in times.items()}
    print(json.dumps({"runs": args.runs, "check_s": {k: [round(x, 2) for x in v] for k, v in times.items()},
                      "median_s": {k: round(v, 2) for k, v in medians.items()},
                      "ratio": round(medians[f"limit {args.limit}"] / medians["no limit"], 3), "waves": said},
                     indent=1))


if __name__ == "__main__":
    main()
