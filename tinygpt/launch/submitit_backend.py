"""The submitit backend: the same runs, resources and profile, submitted as one submitit job array.

The Slurm options, the node setup and the container come from `slurm_options.py`, the same as the sbatch
backend writes, and so does the preemption signal (`SUBMITIT_PREEMPT_SIGNAL` tells submitit's handler
which one the profile asks Slurm for).

The submitted callable, `TrainTask`, runs the trainer in the job's own process and implements submitit's
checkpointing interface. On submitit's signal the trainer does not save inside the signal handler: it
records the request, saves at the next step boundary (all ranks agreeing), and only then hands over to
submitit's own handler, which calls `TrainTask.checkpoint` and requeues the job. On the next start the
trainer resumes from the checkpoint it saved (`resume: auto`).
"""

from __future__ import annotations

import shlex
import signal
import sys
from pathlib import Path
from typing import Any

from . import manifest as manifest_mod
from .plan import Plan
from .slurm_options import container_prefix, sbatch_options, setup_lines


class TrainTask:
    """Picklable: `TrainTask()(manifest_path, index)` trains one run of a sweep; `checkpoint` resubmits it
    unchanged."""

    def __call__(self, manifest_path: str, index: int) -> dict:
        from tinygpt import config, trainer

        config_path = str(manifest_mod.config_file(manifest_mod.load(Path(manifest_path)), index))
        cfg = config.resolve(["--config", config_path])
        signum = getattr(signal, f"SIG{cfg.run.preempt_signal}")
        submitit_handler = signal.getsignal(signum)  # installed by submitit before we were called

        def hand_over_to_submitit() -> None:
            if callable(submitit_handler):
                submitit_handler(signum, None)  # checkpoint() + requeue + exit, submitit's own way

        result = trainer.train(cfg, requeue_hook=hand_over_to_submitit)
        if result.exit_code != 0:
            raise RuntimeError(f"training of {config_path} ended with exit status {result.exit_code}")
        return {"out_dir": str(result.out_dir), "step": result.step, "finished": result.finished,
                "best_val_loss": result.best_val_loss}

    def checkpoint(self, manifest_path: str, index: int):
        import submitit

        # The trainer has already saved; the next start resumes from it.
        return submitit.helpers.DelayedSubmission(TrainTask(), manifest_path, index)


def folder(plan: Plan) -> Path:
    return plan.logs_dir / "submitit"


def python_command(plan: Plan) -> str:
    """How the job starts Python: the profile's interpreter, inside the profile's container if it has one."""
    prof = plan.sweep.profile
    return container_prefix(prof) + shlex.quote(prof.python or sys.executable)


def executor_parameters(plan: Plan, pythonpath: str | None = None) -> dict[str, Any]:
    """`submitit.SlurmExecutor` parameters for the sweep (pure); the jobs import the plan's code."""
    pythonpath = pythonpath or str(plan.code)
    sweep, r, prof = plan.sweep, plan.sweep.resources, plan.sweep.profile
    # submitit writes `additional_parameters` as `#SBATCH --key=value` (quoted), over its own defaults of
    # the same names (time, signal, ...); a flag is True.
    options = sbatch_options(r, prof, plan.workdir)
    additional = {key.replace("-", "_"): True if value is None else value for key, value in options.items()}
    setup = [*setup_lines(prof, pythonpath), f"export SUBMITIT_PREEMPT_SIGNAL={shlex.quote(prof.signal)}"]
    params: dict[str, Any] = dict(job_name=sweep.name, nodes=r.nodes, ntasks_per_node=r.tasks_per_node,
                                  setup=setup, additional_parameters=additional)
    if sweep.array_parallelism:
        params["array_parallelism"] = sweep.array_parallelism
    if r.srun_args:
        params["srun_args"] = list(r.srun_args)
    return params


def render(plan: Plan, pythonpath: str | None = None) -> str:
    """The batch script submitit writes for this sweep's array, by submitit's own renderer (for review and
    the golden-file tests; `submit` lets submitit write it itself)."""
    from submitit.slurm.slurm import _make_sbatch_string

    command = f"{python_command(plan)} -u -m submitit.core._submit {shlex.quote(str(folder(plan)))}"
    return _make_sbatch_string(command=command, folder=folder(plan), map_count=len(plan.sweep.runs),
                               **executor_parameters(plan, pythonpath))


def submit(plan: Plan, dependency: str | None = None) -> list[str]:
    """The sweep as one submitit array (after `dependency`, e.g. afterok:123, when given)."""
    params = executor_parameters(plan)
    if dependency:
        params["additional_parameters"]["dependency"] = dependency
    return [_submit(plan.manifest_path, [run.index for run in plan.sweep.runs], str(folder(plan)),
                    python_command(plan), params)]


def _submit(manifest_path: Path, indices: list[int], job_folder: str, python: str, params: dict[str, Any],
            **record: Any) -> str:
    """One submitit array of the runs `indices`; recorded in the manifest with the executor's parameters (so
    that `launch.py resubmit` asks for the same, changed only where told)."""
    import submitit

    executor = submitit.SlurmExecutor(folder=job_folder, python=python)
    executor.update_parameters(**params)
    jobs = executor.map_array(TrainTask(), [str(manifest_path)] * len(indices), indices)
    ids = {str(index): job.job_id for index, job in zip(indices, jobs)}
    array_id = jobs[0].job_id.split("_")[0]
    manifest_mod.record_submission(manifest_path, "submitit", array_id, indices, per_run_ids=ids, folder=job_folder,
                                   python=python, executor=params, **record)
    return array_id


def resubmit(manifest: manifest_mod.Manifest, indices: list[int], options: dict[str, str],
             previous: dict[str, manifest_mod.Life], dry_run: bool) -> list[str]:
    """The runs `indices` as a new submitit array, with the parameters of the sweep's submission and the
    changed sbatch options (`launch.py resubmit`)."""
    first = next(s for s in manifest.submissions if s.backend == "submitit")
    params = {**first.executor, "additional_parameters": {
        **first.executor["additional_parameters"], **{k.replace("-", "_"): v for k, v in options.items()}}}
    if dry_run:
        print(f"dry run: would submit run(s) {', '.join(map(str, indices))} as a submitit array with "
              f"{', '.join(f'--{k}={v}' for k, v in options.items()) or 'the same options'}")
        return []
    return [_submit(manifest.path, indices, first.folder, first.python, params, changes=options,
                    previous=previous)]
