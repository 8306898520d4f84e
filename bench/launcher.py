"""How fast the launcher answers on a login node (it never imports torch).

    python bench/launcher.py

Prints JSON: the wall time of `python launch.py --help` and of a 256-run `--dry-run` (best of 5 and
median), against the targets of 0.3 s and 1.5 s; and the code snapshot a launch takes (files, size, the
time to take a new one and to find an unchanged one again).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(cmd: list[str], repeat: int = 5, cwd: str | None = None) -> dict:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, cwd=cwd, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        times.append(time.perf_counter() - t0)
    return {"best_s": round(min(times), 3), "median_s": round(statistics.median(times), 3)}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "big.yaml"
        spec.write_text("name: big\ncluster: local\ntrain: {max_steps: 100, min_lr: 1.0e-5}\n"
                        "grid:\n  n_layer: [1, 2, 3, 4]\n  n_head: [1, 2, 4, 8]\n"
                        "  lr: [1.0e-4, 3.0e-4, 1.0e-3, 3.0e-3]\n"
                        "  seed: [1, 2, 3, 4]\nresources: {time: '00:30:00'}\narray_parallelism: 16\n")
        help_t = timed([sys.executable, str(ROOT / "launch.py"), "--help"])
        dry_t = timed([sys.executable, str(ROOT / "launch.py"), str(spec), "--dry-run", "--workdir", tmp])
        runs = len(json.loads((Path(tmp) / "jobs" / "big" / "manifest.json").read_text())["runs"])
    figures = {"help": {**help_t, "target_s": 0.3}, "dry_run": {**dry_t, "runs": runs, "target_s": 1.5}}
    try:
        figures["snapshot"] = snapshot_figures()
    except ImportError:  # a version of the launcher without snapshots
        pass
    print(json.dumps(figures))


def snapshot_figures(repeat: int = 5) -> dict:
    sys.path.insert(0, str(ROOT))
    from tinygpt.launch import snapshot

    taken, reused = [], []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            snap = snapshot.take(ROOT, Path(tmp))
            taken.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            snapshot.take(ROOT, Path(tmp))
            reused.append(time.perf_counter() - t0)
    return {"files": snap.files, "mb": round(snap.bytes / 1e6, 2), "take_median_s": round(statistics.median(taken), 3),
            "reuse_median_s": round(statistics.median(reused), 3)}


if __name__ == "__main__":
    main()
