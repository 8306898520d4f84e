"""How fast the launcher answers on a login node (it never imports torch), each figure beside its target.

    python bench/launcher.py              # everything; the Slurm figures when a cluster answers (up.sh)
    python bench/launcher.py --no-slurm   # only what needs no cluster
    python bench/launcher.py --no-slurm --beside ../old   # and the dry runs of another checkout, in turns

Prints one JSON object:
- `help`: `launch.py --help` (target 0.3 s); `dry_run_256`: a 256-run dry run;
- `dry_run_1`, `dry_run_10000` and `dry_run_100000`: a one-run spec's dry run (the fixed cost: the interpreter,
  the imports, the code snapshot) and a grid's (10 x 10 x 10 x 10; 1,000 seeds x 100 learning rates), each
  try in a fresh work directory: wall time, peak memory of the process, bytes written (targets 0.7 s; 3 s,
  300 MB and 20 MB), and what each run adds to the fixed cost (`marginal_us_per_run`);
- `beside` (with `--beside DIR`): the same three dry runs of the launcher checked out in DIR (e.g. an older
  commit's `git worktree`), measured in turns with this checkout's, so that both see the same machine;
- `record_100_parts_of_100000`: what a real launch of the 100,000-run sweep adds to its dry run to record its
  100 array parts' job ids (the dry run's manifest; each part recorded as the sbatch backend records it);
- `snapshot`: the code snapshot a launch takes (files, size, a new one, an unchanged one found again);
- `status_10000_held` and `resubmit_dry_run_10000_held`, with a Slurm cluster: a held 10,000-run sweep: wall
  time and the calls made to sacct, squeue and scontrol (targets 2 s, 3 calls); `cancel_10000_held`: its
  cancel (once), time and calls;
- `report_1000`: `launch.py report` over 1,000 finished runs (tests/support/finished_sweep.py: one trained, the
  others written).
Times are the best and the median of the tries (3 unless said).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAUNCH = [sys.executable, str(ROOT / "launch.py")]
# Runs `argv`, then prints the peak resident memory of it (and its children) in kB: a process measuring itself.
PEAK = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, capture_output=True); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def env(**extra: str) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), **extra)


def timed(cmd: list[str], repeat: int = 3, fresh=None, extra_env: dict | None = None) -> dict:
    """Best and median wall time of `cmd`, and its peak memory (MB, the largest try); `fresh()` runs before
    each try (untimed)."""
    times, peaks = [], []
    for _ in range(repeat):
        if fresh:
            fresh()
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", PEAK, *cmd], check=True, capture_output=True, text=True,
                             env=env(**(extra_env or {})))
        times.append(time.perf_counter() - t0)
        peaks.append(int(out.stdout.split()[-1]) / 1024)
    return {"best_s": round(min(times), 3), "median_s": round(statistics.median(times), 3),
            "peak_mb": round(max(peaks), 1)}


def grid_spec(path: Path, name: str, grid: dict[str, list]) -> Path:
    lines = "".join(f"  {key}: [{', '.join(map(str, values))}]\n" for key, values in grid.items())
    path.write_text(f"name: {name}\ncluster: local\ntrain: {{min_lr: 1.0e-6}}\ngrid:\n{lines}"
                    "resources: {time: '00:30:00'}\n")
    return path


def runs_of(workdir: Path, name: str) -> int:
    return len(json.loads((workdir / "jobs" / name / "manifest.json").read_text())["runs"])


def written_mb(folder: Path) -> float:
    return round(sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e6, 1)


def dry_run(tmp: Path, name: str, grid: dict[str, list], launch: list[str] = LAUNCH, **targets) -> dict:
    spec, work = grid_spec(tmp / f"{name}.yaml", name, grid), tmp / name
    figures = timed([*launch, str(spec), "--dry-run", "--workdir", str(work)],
                    fresh=lambda: shutil.rmtree(work, ignore_errors=True))
    return {**figures, "runs": runs_of(work, name), "written_mb": written_mb(work), **targets}


def dry_runs(tmp: Path, launch: list[str] = LAUNCH) -> dict:
    """The one-run, 10,000-run and 100,000-run dry runs, each large one with what a run adds to the fixed cost."""
    figures = {"dry_run_1": dry_run(tmp, "one", {"seed": [1]}, launch),
               "dry_run_10000": dry_run(tmp, "ten", TEN_THOUSAND, launch, target_s=0.7),
               "dry_run_100000": dry_run(tmp, "hundred", HUNDRED_THOUSAND, launch, target_s=3.0, target_mb=300,
                                         target_written_mb=20)}
    fixed = figures["dry_run_1"]["best_s"]
    for row in (figures["dry_run_10000"], figures["dry_run_100000"]):
        row["marginal_us_per_run"] = round((row["best_s"] - fixed) / (row["runs"] - 1) * 1e6, 1)
    return figures


def in_turns(tmp: Path, beside: Path, rounds: int = 2) -> tuple[dict, dict]:
    """dry_runs() of this checkout and of `beside`, in turns; each figure the best of its rounds."""
    ours, theirs = [], []
    for _ in range(rounds):  # (theirs first: the work directories left are this checkout's, which later rows read)
        theirs.append(dry_runs(tmp, [sys.executable, str(beside / "launch.py")]))
        ours.append(dry_runs(tmp))
    return best_of(ours), best_of(theirs)


def best_of(tries: list[dict]) -> dict:
    return {label: min((t[label] for t in tries), key=lambda row: row["best_s"]) for label in tries[0]}


TEN_THOUSAND = {"n_layer": [i + 1 for i in range(10)], "lr": [round(1e-4 * (i + 1), 6) for i in range(10)],
                "seed": [i + 1 for i in range(10)], "max_steps": [100 + i for i in range(10)]}
HUNDRED_THOUSAND = {"seed": [i + 1 for i in range(1000)], "lr": [round(1e-4 * (i + 1), 6) for i in range(100)]}


def record_parts(tmp: Path, name: str, parts: int) -> dict:
    """The time to record `parts` array parts of the dry-run sweep `name` (already in tmp/name), as the sbatch
    backend records each part once Slurm has given its id."""
    sys.path.insert(0, str(ROOT))
    from tinygpt.launch import manifest
    from tinygpt.launch.layout import SweepDirs

    path = SweepDirs(tmp / name, name).manifest
    per_part = runs_of(tmp / name, name) // parts
    t0 = time.perf_counter()
    for part in range(parts):
        manifest.record_submission(path, "sbatch", str(1000 + part), list(range(part * per_part, (part + 1) *
                                   per_part)), array=f"0-{per_part - 1}", offset=part * per_part, script="-", pack=1)
    return {"s": round(time.perf_counter() - t0, 3), "parts": parts}


SLURM_READERS = ("sacct", "squeue", "scontrol")


def counting_shims(tmp: Path) -> tuple[dict[str, str], Path]:
    """PATH with Slurm's commands that status, resubmit and cancel call wrapped to count their calls (in the
    returned file)."""
    calls, shims = tmp / "calls", tmp / "bin"
    shims.mkdir(exist_ok=True)
    for command in SLURM_READERS + ("scancel",):
        real = shutil.which(command)
        (shims / command).write_text(f'#!/bin/bash\necho {command} >> "{calls}"\nexec {real} "$@"\n')
        (shims / command).chmod(0o755)
    return {"PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"}, calls


def held_sweep(tmp: Path) -> dict:
    """status and resubmit --dry-run of a held 10,000-run sweep: time and Slurm calls per command."""
    spec, work = grid_spec(tmp / "held.yaml", "held", TEN_THOUSAND), tmp / "held"
    path, calls = counting_shims(tmp)
    figures = {}
    try:
        subprocess.run([*LAUNCH, str(spec), "--hold", "--workdir", str(work)], check=True, capture_output=True,
                       env=env())
        for label, command in (("status_10000_held", ["status"]), ("resubmit_dry_run_10000_held",
                                                                    ["resubmit", "--dry-run"])):
            calls.unlink(missing_ok=True)
            times = timed([*LAUNCH, *command, str(spec), "--workdir", str(work)], extra_env=path)
            names = calls.read_text().split() if calls.exists() else []
            figures[label] = {**times, "runs": runs_of(work, "held"), "target_s": 2.0, "target_calls": 3,
                              "slurm_calls": {c: names.count(c) / 3 for c in SLURM_READERS}}
    finally:
        calls.unlink(missing_ok=True)
        t0 = time.perf_counter()
        cancel = subprocess.run([*LAUNCH, "cancel", str(spec), "--workdir", str(work)], capture_output=True,
                                env=env(**path))
        names = calls.read_text().split() if calls.exists() else []
        figures["cancel_10000_held"] = {"s": round(time.perf_counter() - t0, 3), "exit": cancel.returncode,
                                        "slurm_calls": {c: names.count(c) for c in (*SLURM_READERS, "scancel")}}
    return figures


def report_1000(tmp: Path) -> dict:
    from tests.support.finished_sweep import make
    from tests.support.tiny import TINY_TEXT, train_tiny

    corpus = tmp / "corpus.txt"
    corpus.write_text(TINY_TEXT)
    trained, _ = train_tiny(tmp, corpus, "--progress", "off", "--sample-tokens", "40", name="trained")
    manifest = make(tmp / "reported", trained, 1000)
    return {**timed([*LAUNCH, "report", str(manifest)]), "runs": 1000}


def slurm_answers() -> bool:
    return shutil.which("sinfo") is not None and subprocess.run(["sinfo"], capture_output=True).returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-slurm", action="store_true", help="leave out the figures that need a cluster")
    parser.add_argument("--beside", type=Path, metavar="DIR", help="also the dry runs of the checkout in DIR")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        figures = {"help": {**timed([*LAUNCH, "--help"], repeat=5), "target_s": 0.3},
                   "dry_run_256": dry_run(tmp, "small", {"n_layer": [1, 2, 3, 4], "n_head": [1, 2, 4, 8],
                                                         "lr": [1e-4, 3e-4, 1e-3, 3e-3], "seed": [1, 2, 3, 4]})}
        if args.beside:
            ours, figures["beside"] = in_turns(tmp, args.beside.resolve())
            figures.update(ours)
        else:
            figures.update(dry_runs(tmp))
        figures["record_100_parts_of_100000"] = record_parts(tmp, "hundred", 100)
        try:
            figures["snapshot"] = snapshot_figures()
        except ImportError:  # a version of the launcher without snapshots
            pass
        if not args.no_slurm:
            figures.update(held_sweep(tmp) if slurm_answers() else {"status_10000_held": "no Slurm answers here"})
        figures["report_1000"] = report_1000(tmp)
    print(json.dumps(figures))


def snapshot_figures(repeat: int = 5) -> dict:
    sys.path.insert(0, str(ROOT))
    from tinygpt.launch.submit import snapshot

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
