"""The submitit backend: the same runs, resources and profile, submitted as one submitit job array.

The submitted callable, `TrainTask`, runs the trainer in the job's own process and implements submitit's
checkpointing interface. On submitit's signal the trainer does not save inside the signal handler: it
records the request, saves at the next step boundary (all ranks agreeing), and only then hands over to
submitit's own handler, which calls `TrainTask.checkpoint` and requeues the job. On the next start the
trainer resumes from the checkpoint it saved (`resume: auto`).
"""

from __future__ import annotations

import signal

from . import manifest as manifest_mod
from .plan import REPO_ROOT, Plan


class TrainTask:
    """Picklable: `TrainTask()(config_path)` trains one run; `checkpoint` resubmits it unchanged."""

    def __call__(self, config_path: str) -> dict:
        from tinygpt import config, trainer

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

    def checkpoint(self, config_path: str):
        import submitit

        # The trainer has already saved; the next start resumes from it.
        return submitit.helpers.DelayedSubmission(TrainTask(), config_path)


def submit(plan: Plan) -> list[str]:
    import submitit

    sweep, r, prof = plan.sweep, plan.sweep.resources, plan.sweep.profile
    executor = submitit.AutoExecutor(folder=str(plan.logs_dir / "submitit"), cluster="slurm")
    setup = [f"module load {m}" for m in prof.modules]
    setup += [f"export {k}={_quote(v)}" for k, v in sorted(prof.env.items())]
    setup += list(prof.setup)
    setup.append(f"export PYTHONPATH={_quote(str(REPO_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}")
    params = dict(
        name=sweep.name, nodes=r.nodes, tasks_per_node=r.tasks_per_node, cpus_per_task=r.cpus_per_task,
        timeout_min=r.time_min, slurm_signal_delay_s=prof.signal_lead_s, slurm_setup=setup,
        slurm_additional_parameters={"requeue": True, "chdir": str(plan.workdir)},
    )
    if sweep.array_parallelism:
        params["slurm_array_parallelism"] = sweep.array_parallelism
    if r.partition:
        params["slurm_partition"] = r.partition
    if r.mem_mb:
        params["slurm_mem"] = f"{r.mem_mb}M"
    if r.qos:
        params["slurm_qos"] = r.qos
    if r.account:
        params["slurm_account"] = r.account
    if r.constraint:
        params["slurm_constraint"] = r.constraint
    if r.gpus_per_node:
        if prof.gpu_request == "gres":
            params["slurm_gres"] = f"gpu:{prof.gpu_type + ':' if prof.gpu_type else ''}{r.gpus_per_node}"
        else:
            params["gpus_per_node"] = r.gpus_per_node
    executor.update_parameters(**params)
    manifest = manifest_mod.load(plan.manifest_path)
    configs = [run["config"] for run in manifest["runs"]]
    jobs = executor.map_array(TrainTask(), configs)
    ids = {str(run["index"]): job.job_id for run, job in zip(manifest["runs"], jobs)}
    array_id = jobs[0].job_id.split("_")[0]
    manifest_mod.record_submission(plan.manifest_path, "submitit", array_id, [int(i) for i in ids],
                                   per_run_ids=ids, folder=str(plan.logs_dir / "submitit"))
    return [array_id]


def _quote(value: str) -> str:
    import shlex

    return shlex.quote(value)
