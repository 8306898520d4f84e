"""What waves cost a launch: `launch.py check` of a 10,000-run sweep on the local cluster, with the tests' QOS
`waves` capped at MaxSubmitJobsPerUser=500 and without a cap, side by side (the same spec; the cap is put back
after). Prints each check's wall time, the ratio, and what the capped one says of its waves.

    python bench/waves.py [--runs 10000] [--limit 500] [--repeat 3]

Needs the local cluster with accounts (hpc_lab/local_cluster/up.sh --accounts).
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--limit", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        spec = Path(folder) / "big.yaml"
        spec.write_text(yaml.safe_dump({
            "name": "big", "grid": {"i": list(range(args.runs))}, "resources": {"time": "00:05:00", "qos": "waves"},
            "command": {"project": str(ROOT / "tests/support/foreign"), "argv": ["/bin/sh", "-c", "echo {i}"]}}))
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
