"""Where a sweep's runs go, behind one interface: submit a built plan, resubmit chosen runs, cancel the sweep's
jobs.

    sbatch      the job array's batch scripts that plan.py wrote (one, or one per part at MaxArraySize)
    submitit    submitit's executor: one array of its pickled tasks (node/train_task.py), its own batch script
    local       `--local`: here and now, one run after another, each forked warm (fork_server.py); no job
                is left to act on

Each records its submissions in the manifest, so `status`, `logs`, `resubmit` and `cancel` read them the same
way, and each says what sets it apart (`to_slurm`, `holds`, `refusals`): a launch asks the backend, never which
one it has. The Slurm backends' names are manifest.BACKENDS (what a spec may name); `local` is chosen by --local.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tinygpt.launch import manifest as manifest_mod
from tinygpt.launch.errors import LaunchError
from tinygpt.launch.layout import submitit_folder
from tinygpt.launch.node import run_config, train_task
from tinygpt.launch.slurm import slurm_cli
from tinygpt.launch.submit import fork_server, sbatch
from tinygpt.launch.submit.slurm_options import container_prefix, sbatch_options, setup_lines

if TYPE_CHECKING:
    from collections.abc import Collection

    from tinygpt.launch.manifest import Life, Manifest, RunRecord
    from tinygpt.launch.spec.sweep import Sweep
    from tinygpt.launch.submit.plan import Plan

HOLD_ONLY = "--hold: only for submissions with the sbatch backend (or the data step of --chain)"


class Backend:
    name: str
    # Its runs are Slurm jobs: a launch checks the spec against the live cluster, sends a snapshot of the code,
    # writes a retry policy's heal job and a chain's steps, and a second launch submits only new runs.
    to_slurm = True
    holds = False  # it submits jobs held (--hold); a chain holds its data step whatever the backend

    def refusals(self, sweep: Sweep, *, hold: bool, chain: bool, dry_run: bool, nproc: int) -> list[str]:
        """What of a launch's options this backend cannot do, each with its reason (none: it can)."""
        return [HOLD_ONLY] if hold and not (self.holds or chain) else []

    def warnings(self) -> list[str]:
        """What a launch through this backend says before anything is written (it goes on)."""
        return []

    def submit(self, plan: Plan, hold: bool = False, dependency: str | None = None) -> list[str]:
        """Submit the plan's training jobs (held, after `dependency` such as afterok:123); their ids."""
        raise NotImplementedError

    def resubmit(self, manifest: Manifest, indices: list[int], options: dict[str, str],
                 previous: dict[str, Life], dry_run: bool, round: int | None = None) -> list[str]:
        """Submit the runs `indices` again, with the sbatch long `options` changed ({"time": "04:00:00"});
        `previous` records their last jobs, `round` the retry policy's round they begin. The new ids."""
        raise NotImplementedError

    def cancel(self, manifest: Manifest, runs: Collection[int] | None = None) -> list[str]:
        """scancel every Slurm job of the sweep (the chain's steps too), or the newest job of each run of `runs`
        (by index: an array task each); the ids cancelled."""
        if runs is None:
            ids = sorted({sub.job_id for sub in manifest.slurm_submissions()})
        else:
            tasks = manifest.task_job_ids()
            ids = sorted({tasks[index] for index in runs if index in tasks})
        if ids:
            slurm_cli.require_controller()
            ok, message = slurm_cli.scancel(ids)
            if not ok:
                raise LaunchError(f"scancel failed for {', '.join(ids)}: {message}")
        return ids


class Sbatch(Backend):
    name = "sbatch"
    holds = True

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
                 previous: dict[str, Life], dry_run: bool, round: int | None = None) -> list[str]:
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
            tasks = {(i - offset) // pack for i in group}
            array = ",".join(str(t) for t in sorted(tasks))
            extra = [f"--array={array}", *(f"--{key}={value}" for key, value in options.items())]
            if dry_run:
                print(f"dry run: would run sbatch {shlex.join(extra)} {shlex.quote(script)}")
                continue
            job_id = slurm_cli.sbatch(script, extra)
            runs = sorted(i for i in latest if latest[i][:2] == (script, offset) and (i - offset) // pack in tasks)
            manifest_mod.record_submission(manifest.path, self.name, job_id, runs, array=array, offset=offset,
                                           script=script, pack=pack, changes=options,
                                           previous={k: v for k, v in previous.items() if int(k) in group},
                                           **({"round": round} if round else {}))
            ids.append(job_id)
        return ids


class Submitit(Backend):
    """The same runs, resources and profile as one submitit array: the options come from slurm_options.py, as
    for the sbatch scripts, and submitit writes its own batch script with them."""

    name = "submitit"

    @staticmethod
    def folder(plan: Plan) -> Path:
        return submitit_folder(plan.logs_dir)

    @staticmethod
    def python_command(plan: Plan) -> str:
        """How the job starts Python: the profile's interpreter, inside the profile's container if it has one."""
        return container_prefix(plan.sweep.profile) + shlex.quote(plan.python)

    @staticmethod
    def executor_parameters(plan: Plan, pythonpath: str | None = None) -> dict[str, Any]:
        """`submitit.SlurmExecutor` parameters for the sweep (pure); the jobs import the plan's code."""
        sweep, r, prof = plan.sweep, plan.sweep.resources, plan.sweep.profile
        # submitit writes `additional_parameters` as `#SBATCH --key=value` (quoted), over its own defaults of
        # the same names (time, signal, ...); a flag is True.
        options = sbatch_options(r, prof, plan.workdir)
        additional = {key.replace("-", "_"): True if value is None else value for key, value in options.items()}
        setup = [*setup_lines(prof, pythonpath or str(plan.code)),
                 f"export SUBMITIT_PREEMPT_SIGNAL={shlex.quote(prof.signal)}",
                 sbatch.WAIT_FOR_CONTROLLER, "controller_back || exit 1"]
        params: dict[str, Any] = dict(job_name=sweep.name, nodes=r.nodes, ntasks_per_node=r.tasks_per_node,
                                      setup=setup, additional_parameters=additional)
        if sweep.array_parallelism:
            params["array_parallelism"] = sweep.array_parallelism
        # (what each task gets said on submitit's srun line too, as on ours: sbatch.py, before _trainer)
        params["srun_args"] = [f"--cpus-per-task={r.cpus_per_task}", *r.srun_args]
        return params

    def script(self, plan: Plan, pythonpath: str | None = None) -> str:
        """The batch script submitit writes for this sweep's array, by submitit's own renderer (for review and
        the golden-file tests; `submit` lets submitit write it itself)."""
        from submitit.slurm.slurm import _make_sbatch_string

        folder = self.folder(plan)
        command = f"{self.python_command(plan)} -u -m submitit.core._submit {shlex.quote(str(folder))}"
        return _make_sbatch_string(command=command, folder=folder, map_count=len(plan.sweep.runs),
                                   **self.executor_parameters(plan, pythonpath))

    def submit(self, plan: Plan, hold: bool = False, dependency: str | None = None) -> list[str]:
        """The sweep as one submitit array (after `dependency` when given; --hold is refused for it before
        anything is written)."""
        params = self.executor_parameters(plan)
        if dependency:
            params["additional_parameters"]["dependency"] = dependency
        return [self._submit(plan.manifest_path, [run.index for run in plan.sweep.runs], str(self.folder(plan)),
                             self.python_command(plan), params, task=train_task.TASK_PATH)]

    def resubmit(self, manifest: Manifest, indices: list[int], options: dict[str, str],
                 previous: dict[str, Life], dry_run: bool, round: int | None = None) -> list[str]:
        """The runs `indices` as a new submitit array, with the parameters of the sweep's submission and the
        changed sbatch options."""
        first = next(s for s in manifest.submissions if s.backend == self.name)
        params = {**first.executor, "additional_parameters": {
            **first.executor["additional_parameters"], **{k.replace("-", "_"): v for k, v in options.items()}}}
        if dry_run:
            print(f"dry run: would submit run(s) {', '.join(map(str, indices))} as a submitit array with "
                  f"{', '.join(f'--{k}={v}' for k, v in options.items()) or 'the same options'}")
            return []
        return [self._submit(manifest.path, indices, first.folder, first.python, params, changes=options,
                             previous=previous, task=first.task or train_task.FIRST_TASK_PATH)]

    def _submit(self, manifest_path: Path, indices: list[int], job_folder: str, python: str,
                params: dict[str, Any], task: str, **record: Any) -> str:
        """One submitit array of the runs `indices`, each a task the jobs' code names `task`; recorded in the
        manifest with the executor's parameters (so that a resubmission asks for the same, changed only where
        told) and the task's path."""
        import submitit

        executor = submitit.SlurmExecutor(folder=job_folder, python=python)
        executor.update_parameters(**params)
        jobs = executor.map_array(train_task.task_at(task), [str(manifest_path)] * len(indices), indices)
        ids = {str(index): job.job_id for index, job in zip(indices, jobs)}
        array_id = jobs[0].job_id.split("_")[0]
        manifest_mod.record_submission(manifest_path, self.name, array_id, indices, per_run_ids=ids,
                                       folder=job_folder, python=python, executor=params, task=task, **record)
        return array_id


class Local(Backend):
    """The CPU fallback: every run of a spec, one after another, on this machine, through the same entry point
    and with the same configs and run directories as on the cluster, so that a login-node smoke test exercises
    what the cluster will run. `nproc` > 1 starts each run with that many gloo ranks under torchrun."""

    name = manifest_mod.LOCAL
    to_slurm = False

    def __init__(self, nproc: int = 1, say=print) -> None:
        self.nproc = nproc
        self.say = say

    def refusals(self, sweep: Sweep, *, hold: bool, chain: bool, dry_run: bool, nproc: int) -> list[str]:
        problems = ["--local and --dry-run: choose one"] if dry_run else []
        if hold:
            problems.append(HOLD_ONLY)
        if sweep.command is not None and nproc > 1:
            problems.append("--nproc: starts the trainer's ranks under torchrun; a command runs one process per run "
                            "here")
        return problems

    def warnings(self) -> list[str]:
        if self.nproc > (cpus := len(os.sched_getaffinity(0))):
            return [f"--nproc {self.nproc} ranks share the {cpus} CPU(s) this process may use: each run is slower, "
                    f"not faster, than with --nproc {cpus}"]
        return []

    def submit(self, plan: Plan, hold: bool = False, dependency: str | None = None) -> list[str]:
        """Run every run here (--hold and --chain's dependency mean nothing here); once all have run, an error
        if any failed."""
        failed, runs = self.run_all(plan), len(plan.sweep.runs)
        self.say(f"{runs - failed}/{runs} run(s) finished")
        if failed:
            raise LaunchError(f"{failed} of {runs} run(s) failed here; each one's output is above")
        return [self.name]

    def resubmit(self, manifest: Manifest, indices: list[int], options: dict[str, str],
                 previous: dict[str, Life], dry_run: bool, round: int | None = None) -> list[str]:
        raise LaunchError("resubmit: these runs ran here (--local), with no Slurm job to send again; run them again "
                          "with `launch.py SPEC --local`, or submit them with `launch.py SPEC`")

    def cancel(self, manifest: Manifest, runs: Collection[int] | None = None) -> list[str]:
        return []  # (nothing is left running: a run here ends with the command)

    def run_all(self, plan: Plan) -> int:
        """Run every run in order (packed runs at once, as in one task); return the number that failed."""
        env = _local_env(plan, self.nproc)
        manifest_mod.record_submission(plan.manifest_path, self.name, self.name, [r.index for r in plan.sweep.runs],
                                       nproc=self.nproc)
        manifest = manifest_mod.load(plan.manifest_path)
        runs = manifest.runs
        if manifest.search:
            return self._workers(plan, runs, env)
        if manifest.command is not None:
            return self._commands(plan, runs, env)
        failed, pack = 0, plan.sweep.pack
        for first in range(0, len(runs), pack):
            procs = []
            for run in runs[first:first + pack]:
                self.say(f"=== run {run.index + 1}/{len(runs)}: {run.name} -> {run.out_dir}")
                config = run_config.config_file(manifest, run)
                procs.append((run, start("tinygpt.train", ["--config", str(config), "--device", "cpu"], env,
                                         plan.workdir, self.nproc)))
            for run, proc in procs:
                if proc.wait() != 0:
                    failed += 1
                    self.say(f"=== run {run.name} failed with exit status {proc.returncode}")
        return failed

    def _commands(self, plan: Plan, runs: list[RunRecord], env: dict) -> int:
        """A program of the user's: each run started as on a node (node/supervise.py), a plain process each."""
        failed = 0
        for run in runs:
            self.say(f"=== run {run.index + 1}/{len(runs)}: {run.name} -> {run.out_dir}")
            code = subprocess.call([sys.executable, "-m", "tinygpt.launch.node.supervise", str(plan.manifest_path),
                                    str(run.index)], env=env, cwd=plan.workdir)
            if code != 0:
                failed += 1
                self.say(f"=== run {run.name} failed with exit status {code}")
        return failed

    def _workers(self, plan: Plan, runs: list[RunRecord], env: dict) -> int:
        """An Optuna search here: its workers as processes, all at once (each one trial at a time)."""
        self.say(f"=== {len(runs)} search worker(s) at once, sharing the study in {plan.sweep.dirs.journal}")
        worker = "tinygpt.launch.node.search_worker"
        procs = [start(worker, [str(plan.manifest_path), str(run.index)], env, plan.workdir) for run in runs]
        failed = sum(p.wait() != 0 for p in procs)
        self.say(f"=== {len(runs) - failed}/{len(runs)} worker(s) ended well; `launch.py status` lists the trials")
        return failed


def _local_env(plan: Plan, nproc: int) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(plan.code) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if nproc > 1:
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    return env


def start(module: str, args: list[str], env: dict[str, str], cwd, nproc: int = 1):
    """`python -m MODULE ARGS` here, writing to this terminal: forked from a server that imported torch once
    where that is possible (a sweep of small runs pays for torch's import once), else a new interpreter; under
    torchrun with `nproc` ranks."""
    if nproc > 1:
        return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                 f"--nproc-per-node={nproc}", "-m", module, *args], env=env, cwd=cwd)
    if fork_server.available():
        return fork_server.Forked(module, args, env, cwd, capture=False)
    return subprocess.Popen([sys.executable, "-m", module, *args], env=env, cwd=cwd)


BACKENDS: dict[str, Backend] = {b.name: b for b in (Sbatch(), Submitit())}


def of(name: str) -> Backend:
    """The backend a spec or manifest names."""
    return BACKENDS[name]


def chosen(sweep: Sweep, local: bool, nproc: int = 1) -> Backend:
    """The backend a launch sends the sweep through: --local's, else the one its spec names."""
    return Local(nproc) if local else of(sweep.backend)
