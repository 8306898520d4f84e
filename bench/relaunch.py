"""A sweep of N finished runs relaunched with 10 more points, against a fresh launch of the same N + 10 runs, on the
reachable Slurm (the local cluster: hpc_lab/local_cluster/up.sh). Prints, for each, the wall time of the command
and the array tasks it queued (held: nothing is left running; both are cancelled at the end).

    python bench/relaunch.py [--runs 10000]

The N runs are written as finished, not trained (tests/support/finished_sweep.forgotten): the manifest of a dry
run, one submission by a job Slurm has long forgotten, and each run's metrics.jsonl saying it finished, which is
what a relaunch reads when sacct no longer knows the job.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.support import finished_sweep  # noqa: E402 (importable from the line above)
from tinygpt.launch import manifest as manifest_mod  # noqa: E402


def spec(folder: Path, name: str, runs: int) -> Path:
    path = folder / f"{name}-{runs}.yaml"
    path.write_text(json.dumps({"name": name, "command": {"argv": ["true", "{i}"], "project": str(folder)},
                                "grid": {"i": list(range(runs))}, "resources": {"time": "00:05:00"}}))
    return path


def timed(*args: str) -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, str(ROOT / "launch.py"), *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"launch.py {' '.join(args)} failed: {out.stderr}")
    return time.perf_counter() - start, out.stdout


def queued_tasks(work: Path, name: str, before: int) -> tuple[list[str], int]:
    subs = manifest_mod.load(work / "jobs" / name / "manifest.json").submissions[before:]
    return [s.job_id for s in subs], sum(len(s.indices) for s in subs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    runs = parser.parse_args().runs
    folder = Path(tempfile.mkdtemp(prefix="relaunch-bench-"))
    work, fresh = folder / "work", folder / "fresh"
    timed(str(spec(folder, "big", runs)), "--workdir", str(work), "--dry-run")
    finished_sweep.forgotten(work / "jobs" / "big" / "manifest.json")
    cancel = []
    try:
        seconds, said = timed(str(spec(folder, "big", runs + 10)), "--workdir", str(work), "--hold")
        jobs, tasks = queued_tasks(work, "big", 1)
        cancel += jobs
        print(f"relaunch of {runs} finished runs + 10 new: {seconds:.1f} s, {len(jobs)} job(s), {tasks} task(s) "
              f"queued ({said.splitlines()[0]})")
        seconds, _ = timed(str(spec(folder, "big", runs + 10)), "--workdir", str(fresh), "--hold")
        jobs, tasks = queued_tasks(fresh, "big", 0)
        cancel += jobs
        print(f"fresh launch of the same {runs + 10} runs: {seconds:.1f} s, {len(jobs)} job(s), {tasks} task(s) "
              f"queued")
    finally:
        if cancel:
            subprocess.run(["scancel", *cancel], check=False)


if __name__ == "__main__":
    main()
