"""How fast the launcher answers on a login node (it never imports torch).

    python bench/launcher.py

Prints JSON: the wall time of `python launch.py --help` and of a 256-run `--dry-run` (best of 5 and
median), against the targets of 0.3 s and 1.5 s; the code snapshot a launch takes (files, size, the
time to take a new one and to find an unchanged one again); a 10,000-point grid's dry run, each time into
a fresh work directory (targets: 3 s, 5 MB written); and, when a Slurm cluster answers (the local one:
hpc_lab/local_cluster/up.sh), `launch.py status` of a held 1,000-task array (target 2 s; it is then
cancelled) and how many times status called sacct, squeue and scontrol.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tinygpt.launch.layout import SweepDirs

ROOT = Path(__file__).resolve().parent.parent


def timed(cmd: list[str], repeat: int = 5, cwd: str | None = None, fresh=None, env: dict | None = None) -> dict:
    """Best and median wall time of `cmd`; `fresh()`, when given, runs before each try (untimed)."""
    times = []
    for _ in range(repeat):
        if fresh:
            fresh()
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, cwd=cwd,
                       env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})))
        times.append(time.perf_counter() - t0)
    return {"best_s": round(min(times), 3), "median_s": round(statistics.median(times), 3)}


def grid_spec(path: Path, name: str, sizes: dict[str, int]) -> Path:
    """A grid spec of prod(sizes) runs (each key gets that many values)."""
    values = {"n_layer": lambda i: i + 1, "lr": lambda i: round(1e-4 * (i + 1), 6), "seed": lambda i: i + 1,
              "max_steps": lambda i: 100 + i}
    grid = "".join(f"  {k}: [{', '.join(str(values[k](i)) for i in range(n))}]\n" for k, n in sizes.items())
    path.write_text(f"name: {name}\ncluster: local\ntrain: {{min_lr: 1.0e-6}}\ngrid:\n{grid}"
                    "resources: {time: '00:30:00'}\n")
    return path


def written_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def ten_thousand(repeat: int = 3) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        spec = grid_spec(Path(tmp) / "huge.yaml", "huge", {"n_layer": 10, "lr": 10, "seed": 10, "max_steps": 10})
        work = Path(tmp) / "w"
        times = timed([sys.executable, str(ROOT / "launch.py"), str(spec), "--dry-run", "--workdir", str(work)],
                      repeat, fresh=lambda: shutil.rmtree(work, ignore_errors=True))
        runs = len(json.loads(SweepDirs(work, "huge").manifest.read_text())["runs"])
        return {**times, "runs": runs, "written_mb": round(written_bytes(work) / 1e6, 2), "target_s": 3.0,
                "target_mb": 5.0}


def held_status(repeat: int = 3) -> dict | None:
    if shutil.which("sinfo") is None or subprocess.run(["sinfo"], capture_output=True).returncode != 0:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        spec = grid_spec(Path(tmp) / "held.yaml", "held", {"n_layer": 10, "lr": 10, "seed": 10})
        work = Path(tmp) / "w"
        launch = [sys.executable, str(ROOT / "launch.py")]
        subprocess.run([*launch, str(spec), "--hold", "--workdir", str(work)], check=True, capture_output=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
        calls = Path(tmp) / "calls"
        shims = Path(tmp) / "bin"
        shims.mkdir()
        for command in ("sacct", "squeue", "scontrol"):  # count the calls status makes
            real = shutil.which(command)
            (shims / command).write_text(f'#!/bin/bash\necho {command} >> "{calls}"\nexec {real} "$@"\n')
            (shims / command).chmod(0o755)
        try:
            times = timed([*launch, "status", str(spec), "--workdir", str(work)], repeat,
                          env={"PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"})
        finally:
            subprocess.run([*launch, "cancel", str(spec), "--workdir", str(work)], capture_output=True,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)))
        names = calls.read_text().split() if calls.exists() else []
        return {**times, "tasks": 1000, "target_s": 2.0,
                "calls_per_status": {c: names.count(c) / repeat for c in ("sacct", "squeue", "scontrol")}}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "big.yaml"
        spec.write_text("name: big\ncluster: local\ntrain: {max_steps: 100, min_lr: 1.0e-5}\n"
                        "grid:\n  n_layer: [1, 2, 3, 4]\n  n_head: [1, 2, 4, 8]\n"
                        "  lr: [1.0e-4, 3.0e-4, 1.0e-3, 3.0e-3]\n"
                        "  seed: [1, 2, 3, 4]\nresources: {time: '00:30:00'}\narray_parallelism: 16\n")
        help_t = timed([sys.executable, str(ROOT / "launch.py"), "--help"])
        dry_t = timed([sys.executable, str(ROOT / "launch.py"), str(spec), "--dry-run", "--workdir", tmp])
        runs = len(json.loads(SweepDirs(Path(tmp), "big").manifest.read_text())["runs"])
    figures = {"help": {**help_t, "target_s": 0.3}, "dry_run": {**dry_t, "runs": runs, "target_s": 1.5}}
    try:
        figures["snapshot"] = snapshot_figures()
    except ImportError:  # a version of the launcher without snapshots
        pass
    figures["dry_run_10000"] = ten_thousand()
    figures["status_1000_held"] = held_status() or "no Slurm answers here"
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
