"""`python -m tinygpt.train` (and the `tinygpt-train` command): the one entry point for every way of training.

    python -m tinygpt.train --n-layer 2 --max-steps 100               # one CPU process
    torchrun --nproc-per-node 4 -m tinygpt.train --config run.yaml     # DDP from torchrun's env
    srun python -m tinygpt.train --n-layer 6 --n-embd 384              # DDP from Slurm's env

This module parses, hands the config to `tinygpt.training.trainer` and turns what can go wrong into a message
and an exit status. It imports no torch until there is something to train: `--help` and a bad flag
answer at once.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import TYPE_CHECKING

from tinygpt.base.errors import FULL, filesystem_message

# (light modules only: cli() records Slurm's signals before the configuration's schema, pydantic, loads)
from tinygpt.training import packing, preemption

if TYPE_CHECKING:
    from tinygpt.base.config import TrainConfig


def main(argv: list[str] | None = None) -> int:
    """Train from command-line arguments; 0 on success, 2 for a bad configuration, 1 for other errors."""
    from tinygpt.base import config as config_mod

    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(config_mod.help_text())
        return 0
    try:
        cfg = config_mod.resolve(argv)
    except config_mod.ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from tinygpt.data import DataError
    from tinygpt.training import trainer  # torch, from here on
    from tinygpt.training.distributed import JoinError
    from tinygpt.training.precision import PrecisionError
    from tinygpt.training.rundir_lock import RunDirBusy
    from tinygpt.training.tracking import TrackingError

    try:
        return trainer.train(cfg).exit_code
    except (DataError, trainer.TrainingError, PrecisionError, TrackingError, RunDirBusy, JoinError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # the filesystem refused (full, read-only, permissions): what, where, and the fix
        again = "; then run the same command again: the run resumes from its newest checkpoint" \
            if err.errno in FULL else ""
        print(f"error: cannot go on: {_key_of(err, cfg)}{filesystem_message(err)}{again}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _key_of(err: OSError, cfg: TrainConfig) -> str:
    """`out_dir: ` where the filesystem refused the run directory or a folder on the way to it."""
    refused, out_dir = str(err.filename or ""), str(cfg.run.out_dir)
    return "out_dir: " if refused and (out_dir.startswith(refused) or refused.startswith(out_dir)) else ""


def cli() -> None:
    """A trainer process's whole life, the same for `python -m tinygpt.train` and `tinygpt-train`.

    Slurm's warning can arrive before torch has even been imported (a requeued job with little time left,
    a loaded node), even before the configuration has loaded: from the first instant, it is recorded instead of
    killing the process with the default action; the trainer's handler picks up what was recorded.
    """
    preemption.install_early_recorder()
    packing.take_pack_share()
    exit_process(main())


def exit_process(code: int) -> None:
    """End the process. A distributed rank leaves without Python's finalisation.

    Everything a run writes is flushed and closed by now (checkpoints are fsynced, the metrics file closed,
    the process group destroyed). What finalisation would still do is run C++ destructors of the
    collective library's threads, which can abort the process ("terminate called without an active
    exception", SIGABRT) after it has finished its work, and fail a finished job. Python's exit hooks still
    run first (W&B's service and temporary folders are taken down by them, not left behind on the node).
    Slurm's signals are ignored from here on: the run has nothing more to save (preemption.py).
    """
    from tinygpt.training import distributed

    preemption.ignore_from_now_on()
    if distributed.detect().is_distributed:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    cli()
