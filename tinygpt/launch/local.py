"""The CPU fallback: every run of a spec, one after another, on this machine, through the same entry point.

`--nproc N` starts each run with N gloo ranks under torchrun. Same configs, same run directories as on
the cluster, so a login-node smoke test exercises exactly what the cluster will run. On Linux each run (and
each search worker) is `python -m` forked from one server that imported torch once (tinygpt/forked.py): a
sweep of small runs pays for torch's import once, not once a run.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tinygpt import forked

from . import manifest as manifest_mod
from .plan import Plan


def start(module: str, args: list[str], env: dict[str, str], cwd, nproc: int = 1):
    """`python -m MODULE ARGS` here, writing to this terminal: forked warm where that is possible, else a new
    interpreter; under torchrun with `nproc` ranks."""
    if nproc > 1:
        return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                 f"--nproc-per-node={nproc}", "-m", module, *args], env=env, cwd=cwd)
    if forked.available():
        return forked.Forked(module, args, env, cwd, capture=False)
    return subprocess.Popen([sys.executable, "-m", module, *args], env=env, cwd=cwd)


def run_all(plan: Plan, nproc: int = 1, say=print) -> int:
    """Run every run in order; return the number that failed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(plan.code) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if nproc > 1:
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    failed = 0
    manifest = manifest_mod.record_submission(plan.manifest_path, manifest_mod.LOCAL, manifest_mod.LOCAL,
                                              [r.index for r in plan.sweep.runs], nproc=nproc)
    runs = manifest.runs
    if manifest.search:
        return _workers(plan, runs, env, say)
    pack = plan.sweep.pack  # (packed runs run at once here too, as they would in one task)
    for first in range(0, len(runs), pack):
        procs = []
        for run in runs[first:first + pack]:
            say(f"=== run {run.index + 1}/{len(runs)}: {run.name} -> {run.out_dir}")
            config = manifest_mod.config_file(manifest, run.index)
            procs.append((run, start("tinygpt.train", ["--config", str(config), "--device", "cpu"], env,
                                     plan.workdir, nproc)))
        for run, proc in procs:
            if proc.wait() != 0:
                failed += 1
                say(f"=== run {run.name} failed with exit status {proc.returncode}")
    return failed


def _workers(plan: Plan, runs: list[manifest_mod.RunRecord], env: dict, say) -> int:
    """An Optuna search here: its workers as processes, all at once (each one trial at a time)."""
    say(f"=== {len(runs)} search worker(s) at once, sharing the study in {plan.jobs_dir / 'optuna.journal'}")
    procs = [start("tinygpt.search_worker", [str(plan.manifest_path), str(run.index)], env, plan.workdir)
             for run in runs]
    failed = sum(p.wait() != 0 for p in procs)
    say(f"=== {len(runs) - failed}/{len(runs)} worker(s) ended well; `launch.py status` lists the trials")
    return failed
