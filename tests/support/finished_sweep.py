"""A finished sweep of many runs without training them: the reading commands (status, report) at scale.

One run is trained for real (the report draws its attention maps from its checkpoint, and it has the lowest
validation loss); every other run is its copy with written metrics: a start, evaluations whose losses depend
on its seed, the end. Usable from the tests and from bench/launcher.py (which puts tests/ on sys.path).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from tinygpt.launch.manifest import FORMAT
from tinygpt.training import metrics


def make(workdir: Path, trained: Path, runs: int, name: str = "big") -> Path:
    """The manifest of sweep `name` under `workdir`: `runs` finished runs (lr=..., seed=...), run 0 a copy of the
    run directory `trained` (a real run), the others with its config and sample, and written metrics."""
    # Written out, layout.SweepDirs's names and the runs' key as every launcher reads it (`overrides`), so that
    # bench/launcher.py --beside measures another checkout's launcher on the very same sweep.
    runs_dir, jobs_dir = workdir / "runs" / name, workdir / "jobs" / name
    records = []
    best = min(r["val_loss"] for r in metrics.read(metrics.of_run(trained)) if r.get("val_loss") is not None)
    for index in range(runs):
        seed, lr = index // 10 + 1, round(1e-3 * (index % 10 + 1), 6)
        run_name = f"seed={seed},lr={lr}"
        run_dir = runs_dir / run_name
        if index == 0:
            shutil.copytree(trained, run_dir)
        else:
            run_dir.mkdir(parents=True)
            for file in ("config.yaml", "samples.txt"):
                if (trained / file).exists():
                    shutil.copy(trained / file, run_dir / file)
            worse = best + 0.01 + (seed % 7) * 0.05 + (index % 10) * 0.01
            lines = [{"step": 0, "event": "start", "restarts": 0}]
            lines += [{"step": s, "val_loss": worse + (20 - s) * 0.02, "train_loss": worse, "elapsed_s": s * 0.1,
                       "train_s": s * 0.1} for s in (10, 20)]
            lines.append({"step": 20, "event": "finished", "best_val_loss": worse, "elapsed_s": 2.0})
            metrics.of_run(run_dir).write_text("".join(json.dumps(line) + "\n" for line in lines))
        records.append({"index": index, "name": run_name, "overrides": {"seed": seed, "lr": lr},
                        "out_dir": str(run_dir), "max_steps": 20})
    jobs_dir.mkdir(parents=True, exist_ok=True)
    (jobs_dir / "manifest.json").write_text(json.dumps({
        "format": FORMAT, "name": name, "workdir": str(workdir), "logs_dir": str(workdir / "logs" / name),
        "backend": "sbatch", "base": {}, "code": {}, "resources": {}, "submissions": [], "runs": records}))
    return jobs_dir / "manifest.json"


FORGOTTEN_JOB = "99999990"  # a job id the controller never gave: one that has long left sacct, to Slurm


def forgotten(manifest_path: Path) -> None:
    """The runs of a sweep written by a dry run, made finished long ago: one submission by a job Slurm no longer
    knows, and each run's own record that its program finished (what a relaunch then reads)."""
    from tinygpt.launch import manifest as manifest_mod

    runs = manifest_mod.load(manifest_path).runs
    manifest_mod.record_submission(manifest_path, "sbatch", FORGOTTEN_JOB, [r.index for r in runs],
                                   array=f"0-{len(runs) - 1}", offset=0)
    for run in runs:
        Path(run.out_dir).mkdir(parents=True, exist_ok=True)
        metrics.of_run(Path(run.out_dir)).write_text(json.dumps({"event": "finished", "step": 0, "time": 0}) + "\n")


def named_as_before(manifest_path: Path) -> None:
    """The sweep of a dry run of one key's grid, as a launcher before run names were safe in `--key=value` words
    wrote it: runs named `key=value` (layout.NAMING's 1), a manifest without `naming`, their directories so named."""
    text = manifest_path.read_text()
    text = re.sub(r'("index": \d+, "name": "[a-z_]+)-', r'\1=', text.replace('\n "naming": 2,', ""))
    manifest_path.write_text(text)
