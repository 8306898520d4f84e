"""From a validated sweep to files on disk: run configs, batch scripts and the manifest.

    <workdir>/jobs/<sweep>/manifest.json         the runs (their shared and own trainer inputs) and job ids
    <workdir>/jobs/<sweep>/configs/<run>.yaml    a run's resolved trainer config, written when its task starts
    <workdir>/jobs/<sweep>/<sweep>.sbatch        the job array (…-partN.sbatch when split)
    <workdir>/jobs/<sweep>/code/<digest>/        the code the jobs run (snapshot.py)
    <workdir>/logs/<sweep>/                      Slurm output, one file per array task
    <workdir>/runs/<sweep>/<run>/                what the trainer writes
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinygpt import durable

from . import manifest as manifest_mod
from . import slurm_cli
from .sbatch import ScriptParams, render
from .snapshot import Snapshot
from .spec import Run, Sweep

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Plan:
    sweep: Sweep
    workdir: Path
    jobs_dir: Path
    logs_dir: Path
    manifest_path: Path
    scripts: list[tuple[Path, str, int, list[int]]]  # (path, array spec, offset, run indices)
    code: Path = REPO_ROOT  # what the jobs import: the sweep's code snapshot, or the live checkout

    @property
    def python(self) -> str:
        return self.sweep.profile.python or sys.executable


def build(sweep: Sweep, snapshot: Snapshot | None = None) -> Plan:
    """Write every run's config, the batch scripts and the manifest. Submits nothing. The jobs run the code
    of `snapshot` (see snapshot.py), or the live checkout without one."""
    workdir = sweep.workdir
    jobs_dir, logs_dir, manifest_path = sweep.dirs.jobs, sweep.dirs.logs, sweep.dirs.manifest
    logs_dir.mkdir(parents=True, exist_ok=True)
    base, runs = _runs(sweep)
    previous = manifest_mod.load(manifest_path).submissions if manifest_path.exists() else []
    r = sweep.resources
    manifest_mod.create(manifest_path, {
        "name": sweep.name,
        "spec": str(sweep.spec_path.resolve()),
        "backend": sweep.backend,
        "cluster": sweep.profile.name,
        "workdir": str(workdir),
        "logs_dir": str(logs_dir),
        "resources": {"nodes": r.nodes, "gpus_per_node": r.gpus_per_node, "tasks_per_node": r.tasks_per_node,
                      "cpus_per_task": r.cpus_per_task, "mem_mb": r.mem_mb, "time": r.time,
                      "partition": r.partition},
        "code": snapshot.record() if snapshot else {"snapshot": None, "path": str(REPO_ROOT)},
        "base": base,
        "search": {**sweep.search, "journal": str(jobs_dir / "optuna.journal")} if sweep.search else None,
        "runs": runs,
        "submissions": previous,
    })

    code = snapshot.path if snapshot else REPO_ROOT
    scripts = []
    if sweep.backend == "sbatch":
        # Task ids must stay below MaxArraySize: Slurm's own when it is reachable, else the profile's.
        limit = slurm_cli.max_array_size(sweep.profile.cluster_name) or sweep.profile.max_array_size
        size, pack = max(1, limit - 1), sweep.pack
        tasks = [list(range(i, min(i + pack, len(runs)))) for i in range(0, len(runs), pack)]
        chunks = [[i for task in tasks[t:t + size] for i in task] for t in range(0, len(tasks), size)]
        for k, indices in enumerate(chunks):
            suffix = f"-part{k + 1}" if len(chunks) > 1 else ""
            path = jobs_dir / f"{sweep.name}{suffix}.sbatch"
            array = f"0-{-(-len(indices) // pack) - 1}"
            if sweep.array_parallelism:
                array += f"%{sweep.array_parallelism}"
            params = ScriptParams(
                job_name=sweep.name, array=array, offset=indices[0], manifest=str(manifest_path),
                script_path=str(path), log_dir=str(logs_dir), workdir=str(workdir),
                python=sweep.profile.python or sys.executable, pythonpath=str(code),
                resources=r, profile=sweep.profile, worker=sweep.search is not None, pack=pack,
                runs=len(runs),
            )
            durable.write(path, render(params))
            path.chmod(0o755)
            scripts.append((path, array, indices[0], indices))
    return Plan(sweep, workdir, jobs_dir, logs_dir, manifest_path, scripts, code)


def _runs(sweep: Sweep) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The trainer inputs every run shares, once, and each run with only its own (a run's config file is
    written from these when its task starts: `manifest config`), so that a sweep of 10,000 runs is one
    small file."""
    base = {k: v for k, v in sweep.runs[0].inputs.items() if k != "out_dir"} if sweep.runs else {}
    missing = object()
    for run in sweep.runs[1:]:
        for key in [k for k, v in base.items() if run.inputs.get(k, missing) != v]:
            del base[key]
    runs = []
    for run in sweep.runs:
        own = {k: v for k, v in run.inputs.items() if k != "out_dir" and (k not in base or base[k] != v)}
        runs.append({"index": run.index, "name": run.name, "overrides": own, "out_dir": run.config.run.out_dir,
                     "max_steps": run.config.optim.max_steps})
    return base, runs


def corpora(sweep: Sweep) -> list[Run]:
    """The first run of each distinct corpus (dataset, data file, data folder) of the sweep."""
    first: dict[tuple, Run] = {}
    for run in sweep.runs:
        data = run.config.data
        first.setdefault((data.dataset, data.data_file, data.data_dir), run)
    return list(first.values())


def prepare_data(sweep: Sweep) -> tuple[list[str], list[str]]:
    """Prepare each distinct corpus once on this node, so array tasks only read: (the prepared folders, the
    problems of the corpora that could not be prepared, one message each)."""
    from tinygpt.data import DataError, prepare_from_config

    done, problems = [], []
    for run in corpora(sweep):
        data = run.config.data
        try:
            prepared = prepare_from_config(data.dataset, data.data_file, data.data_dir,
                                           warn=lambda m: print(f"warning: {m}", file=sys.stderr))
        except DataError as err:
            problems.append(f"run `{run.name}`: {err}")
            continue
        done.append(str(prepared.path))
    return done, problems
