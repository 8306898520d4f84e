"""What `launch.py serve` costs on a sweep of 10,000 runs, each with a metrics file (a dry run: no Slurm asked).

    python bench/serve.py [--runs 10000] [--lines 20]

Prints one JSON object, each figure beside its target (issue 79): `first_load` (the sweep page and its view: a page
of the status, the curves drawn; the wall time and this process's CPU seconds, target 2 s) and `refresh` (the view
asked again once ten runs have stepped: target 0.5 s of CPU), the best and median of 3 tries,
and the bytes each answer sends. The client is this process too, so its CPU figures hold the client's JSON parsing
as well: an upper bound on the server's. The machine's CPU is named.
"""

from __future__ import annotations

import argparse
import http.client
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tinygpt.launch.read import run_states  # noqa: E402
from tinygpt.launch.serve import server as server_mod  # noqa: E402
from tinygpt.launch.serve.reading import Reader  # noqa: E402


def sweep(work: Path, runs: int, lines: int) -> None:
    """A dry run of `runs` runs of a program, each with `lines` metrics lines written."""
    spec = work / "big.yaml"
    spec.write_text(json.dumps({"name": "big", "command": {"argv": ["prog", "{i}"], "project": str(work)},
                                "grid": {"i": list(range(runs))}, "resources": {"time": "00:05:00"}}))
    subprocess.run([sys.executable, str(ROOT / "launch.py"), str(spec), "--dry-run", "--workdir", str(work)],
                   check=True, capture_output=True)
    for i in range(runs):
        run = work / "runs" / "big" / f"i-{i}"
        run.mkdir(parents=True, exist_ok=True)
        (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 2 + i % 97 / 100 - s / 100}) + "\n"
                                                   for s in range(1, lines + 1)))


def questions(port: int, cookie: str, first: bool) -> tuple[float, float, dict[str, int]]:
    """What the page asks on its first load (its HTML, then its view) or on a refresh (its view): wall seconds, CPU
    seconds, bytes of each answer."""
    sizes = {}
    t0, c0 = time.perf_counter(), time.process_time()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Host": f"127.0.0.1:{port}", "Cookie": cookie}
    for name, path in (("page", "/sweep/big"), ("view", "/api/sweeps/big/view?page=0"))[0 if first else 1:]:
        conn.request("GET", path, headers=headers)
        body = conn.getresponse().read()
        sizes[name] = len(body)
        if name == "view":
            json.loads(body)  # (the page parses it: counted too)
    conn.close()
    return time.perf_counter() - t0, time.process_time() - c0, sizes


def figures(tries: list[tuple[float, float, dict]], target_cpu: float | None, target_wall: float | None) -> dict:
    wall, cpu = [t[0] for t in tries], [t[1] for t in tries]
    return {"wall_s": {"best": round(min(wall), 3), "median": round(statistics.median(wall), 3)},
            "cpu_s": {"best": round(min(cpu), 3), "median": round(statistics.median(cpu), 3)},
            "bytes": tries[-1][2], "target": {"wall_s": target_wall, "cpu_s": target_cpu}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--lines", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sweep(work, args.runs, args.lines)
        first, refresh = [], []
        for _ in range(3):
            run_states._READ.clear()  # (as a new server process: nothing read yet)
            server = server_mod.Server(Reader(work), idle_s=600)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            cookie = f"{server.cookie}={server.token}"
            first.append(questions(server.port, cookie, True))
            for i in range(10):  # ten runs step
                with (work / "runs" / "big" / f"i-{i}" / "metrics.jsonl").open("a") as f:
                    f.write(json.dumps({"step": 10_000 + len(first), "loss": 1.0}) + "\n")
            refresh.append(questions(server.port, cookie, False))
            server.shutdown()
            server.server_close()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(json.dumps({"cpu": cpu, "runs": args.runs, "lines_per_run": args.lines,
                      "first_load": figures(first, None, 2.0), "refresh": figures(refresh, 0.5, None)}, indent=1))


if __name__ == "__main__":
    main()
