"""What a submitit job runs: `TrainTask()(manifest_path, index)` trains one run of a sweep in the job's own
process, and `task_at` names it by the import path that the job's own code snapshot has.
"""

from __future__ import annotations

import importlib
import signal
from pathlib import Path

from tinygpt.launch import manifest as manifest_mod
from tinygpt.launch.node import run_config

# Where the code snapshots of sweeps submitted before the launcher was laid out in wings keep the class: their
# manifests name no task path, and their jobs unpickle the task by this one.
FIRST_TASK_PATH = "tinygpt.launch.backends.TrainTask"
TASK_PATH = f"{__name__}.TrainTask"


class TrainTask:
    """What a submitit job runs, picklable: `TrainTask()(manifest_path, index)` trains one run of a sweep in the
    job's own process; `checkpoint` (submitit's interface) resubmits it unchanged. On submitit's signal the
    trainer saves at its next step boundary, then hands over to submitit's own handler, which calls
    `checkpoint` and requeues the job; the next start resumes from the checkpoint."""

    def __call__(self, manifest_path: str, index: int) -> dict:
        from tinygpt.base import config
        from tinygpt.training import trainer

        config_path = str(run_config.config_file(*manifest_mod.load_run(Path(manifest_path), index)))
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

        return submitit.helpers.DelayedSubmission(TrainTask(), manifest_path, index)


class _Imported:
    """Pickles as `importlib.import_module(module)`: no object of this project's is named in the pickle."""

    def __init__(self, module: str):
        self.module = module

    def __reduce__(self):
        return importlib.import_module, (self.module,)


class _Attribute:
    """Pickles as `getattr(module, name)`, the module imported where it is unpickled."""

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name

    def __reduce__(self):
        return getattr, (_Imported(self.module), self.name)


class _Instance:
    """Pickles as `path()`: the class at `path` in the code that unpickles it, instantiated."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        module, _, name = self.path.rpartition(".")
        # (`type.__call__(cls)` makes an instance; `cls.__call__` would be the instances' own __call__)
        return type.__call__, (_Attribute(module, name),)


def task_at(path: str) -> TrainTask | _Instance:
    """The task to pickle for a job whose code names it `path`: this very class when that is where it is, else a
    stand-in that unpickles as an instance of the class at `path` (a resubmission of an older sweep runs that
    sweep's own code snapshot, which keeps it elsewhere)."""
    return TrainTask() if path == TASK_PATH else _Instance(path)
