"""Where a sweep's runs go, behind one interface: submit a built plan, resubmit chosen runs, cancel the sweep's
jobs.

    sbatch      our own batch scripts (plan.py writes them: one job array, split at MaxArraySize)
    submitit    submitit's executor (submitit_backend.py), one array of its pickled tasks
    local       `--local`: here and now, one run after another (local.py); no job is left to act on

Each records its submissions in the manifest, so `status`, `logs`, `resubmit` and `cancel` read them the same
way. The Slurm backends' names are the spec's choices (spec.BACKENDS); `local` is chosen by --local.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from . import manifest as manifest_mod
from . import slurm_cli
from .errors import LaunchError

if TYPE_CHECKING:
    from .manifest import Life, Manifest
    from .plan import Plan


class Backend:
    name: str

    def submit(self, plan: Plan, hold: bool = False, dependency: str | None = None) -> list[str]:
        """Submit the plan's training jobs (held, after `dependency` such as afterok:123); their ids."""
        raise NotImplementedError

    def resubmit(self, manifest: Manifest, indices: list[int], options: dict[str, str],
                 previous: dict[str, Life], dry_run: bool) -> list[str]:
        """Submit the runs `indices` again, with the sbatch long `options` changed ({"time": "04:00:00"});
        `previous` records their last jobs. The new ids."""
        raise NotImplementedError

    def cancel(self, manifest: Manifest) -> list[str]:
        """scancel every Slurm job of the sweep (the chain's steps too); the ids cancelled."""
        ids = sorted({sub.job_id for sub in manifest.slurm_submissions()})
        if ids:
            ok, message = slurm_cli.scancel(ids)
            if not ok:
                raise LaunchError(f"scancel failed for {', '.join(ids)}: {message}")
        return ids


class Sbatch(Backend):
    name = "sbatch"

    def submit(self, plan: Plan, hold: bool = False, dependency: str | None = None) -> list[str]:
        ids = []
        for path, array, offset, indices in plan.scripts:
            extra = (["--hold"] if hold else []) + ([f"--dependency={dependency}"] if dependency else [])
            job_id = slurm_cli.sbatch(str(path), extra)
            manifest_mod.record_submission(plan.manifest_path, self.name, job_id, indices, array=array,
                                           offset=offset, script=str(path), pack=plan.sweep.pack)
            ids.append(job_id)
        return ids

    def resubmit(self, manifest: Manifest, indices: list[int], options: dict[str, str],
                 previous: dict[str, Life], dry_run: bool) -> list[str]:
        """One `sbatch --array=<their task ids>` per batch script the runs came from (one, unless the sweep was
        split at MaxArraySize), with the changed options on the command line over the script's own."""
        latest: dict[int, tuple[str, int, int]] = {}  # run index -> its newest job's (script, offset, pack)
        for sub in manifest.submissions:
            for index in sub.indices if sub.script else []:
                latest[index] = (sub.script, sub.offset, sub.pack)
        by_script: dict[tuple[str, int, int], list[int]] = {}
        for index in indices:
            by_script.setdefault(latest[index], []).append(index)
        ids = []
        for (script, offset, pack), group in by_script.items():
            # (a packed task holds `pack` runs: its finished runs start, see that they are done, and end at once)
            array = ",".join(str(t) for t in sorted({(i - offset) // pack for i in group}))
            extra = [f"--array={array}", *(f"--{key}={value}" for key, value in options.items())]
            if dry_run:
                print(f"dry run: would run sbatch {shlex.join(extra)} {shlex.quote(script)}")
                continue
            job_id = slurm_cli.sbatch(script, extra)
            tasks = {(i - offset) // pack for i in group}
            runs = sorted(i for i in latest if latest[i][:2] == (script, offset) and (i - offset) // pack in tasks)
            manifest_mod.record_submission(manifest.path, self.name, job_id, runs, array=array, offset=offset,
                                           script=script, pack=pack, changes=options,
                                           previous={k: v for k, v in previous.items() if int(k) in group})
            ids.append(job_id)
        return ids


class Submitit(Backend):
    name = "submitit"

    def submit(self, plan: Plan, hold: bool = False, dependency: str | None = None) -> list[str]:
        from . import submitit_backend

        return submitit_backend.submit(plan, dependency)  # (--hold is refused for it before anything is written)

    def resubmit(self, manifest: Manifest, indices: list[int], options: dict[str, str],
                 previous: dict[str, Life], dry_run: bool) -> list[str]:
        from . import submitit_backend

        return submitit_backend.resubmit(manifest, indices, options, previous, dry_run)


class Local(Backend):
    name = manifest_mod.LOCAL

    def __init__(self, nproc: int = 1) -> None:
        self.nproc = nproc  # gloo ranks per run

    def submit(self, plan: Plan, hold: bool = False, dependency: str | None = None) -> list[str]:
        """Run every run here, one after another (--hold and --chain's dependency mean nothing here); once
        all have run, an error if any failed."""
        from . import local

        failed, runs = local.run_all(plan, nproc=self.nproc), len(plan.sweep.runs)
        print(f"{runs - failed}/{runs} run(s) finished")
        if failed:
            raise LaunchError(f"{failed} of {runs} run(s) failed here; each one's output is above")
        return [self.name]

    def resubmit(self, manifest: Manifest, indices: list[int], options: dict[str, str],
                 previous: dict[str, Life], dry_run: bool) -> list[str]:
        raise LaunchError("resubmit: no job of this sweep was submitted to Slurm; launch it first (runs of "
                          "--local are run again with --local)")

    def cancel(self, manifest: Manifest) -> list[str]:
        return []  # (nothing is left running: a run here ends with the command)


BACKENDS: dict[str, Backend] = {b.name: b for b in (Sbatch(), Submitit())}  # (those a spec may name)


def of(name: str) -> Backend:
    """The backend a spec or manifest names."""
    return BACKENDS[name]
