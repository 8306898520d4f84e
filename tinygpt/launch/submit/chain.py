"""A job chain from one call (`launch.py SPEC --chain`): data, then training, then the report.

    <sweep>-data     one small task: prepares each distinct corpus of the sweep (tinygpt.data prepare); a
                     program of the user's (`command:`) brings its own data: its chain has no data step
    <sweep>          the training array, with --dependency=afterok:<data job>
    <sweep>-report   one small task after the whole array (afterany): writes runs/<sweep>/report.md

A chain larger than the queue limits let out at once goes out in waves (heal/waves.py): its first wave after
the data step, and the report after the last wave, sent by the heal job that sends it.

The small steps ask for one CPU, no GPU and at most an hour, with the sweep's partition, account and
profile setup. `launch.py cancel` cancels all three; `status` shows the chain above its table. With
`--local` the same three steps run here, in order.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from tinygpt.base import durable
from tinygpt.launch import manifest as manifest_mod
from tinygpt.launch.layout import STEP_LOG_PATTERN
from tinygpt.launch.slurm import slurm_cli
from tinygpt.launch.spec.corpora import first_runs
from tinygpt.launch.spec.resources import Minutes
from tinygpt.launch.submit.sbatch import render_step
from tinygpt.launch.submit.slurm_options import container_prefix

if TYPE_CHECKING:
    from tinygpt.launch.submit.plan import Plan

STEP_MAX = Minutes(60)
ROLES = ("data", "report")  # the steps' roles in the manifest's submissions


def data_commands(plan: Plan, python: str) -> list[str]:
    """`tinygpt.data prepare` for each distinct corpus of the sweep."""
    commands = []
    for run in first_runs(plan.sweep):
        data = run.config.data
        args = ["prepare", data.dataset, *(["--data-file", data.data_file] if data.data_file else []),
                "--data-dir", data.data_dir]
        commands.append(f"{python} -m tinygpt.data {shlex.join(args)}")
    return commands


def write_scripts(plan: Plan) -> dict[str, Path]:
    """The data and report steps' batch scripts, next to the training script."""
    sweep = plan.sweep
    small = dataclasses.replace(sweep.resources, nodes=1, gpus_per_node=0, tasks_per_node=1, cpus_per_task=1,
                                mem_mb=None, time=min(sweep.resources.time, STEP_MAX), srun_args=())
    python = f'{container_prefix(sweep.profile)}"$PYTHON"'
    commands = {"report": [f"{python} -m tinygpt.launch.commands.cli report {shlex.quote(str(plan.manifest_path))}"]}
    if sweep.command is None:  # (a program of the user's brings its own data: nothing to prepare)
        commands = {"data": data_commands(plan, python), **commands}
    paths = {}
    for step, lines in commands.items():
        path = sweep.dirs.step_script(step)
        text = render_step(f"{sweep.name}-{step}", lines, small, sweep.profile, str(plan.workdir),
                           str(plan.logs_dir / STEP_LOG_PATTERN.format(step=step)), plan.python, str(plan.code))
        durable.write(path, text)
        paths[step] = path
    return paths


def submit(plan: Plan, scripts: dict[str, Path], submit_training, hold: bool) -> dict[str, list[str]]:
    """Submit data -> training -> report (a command's chain has no data step); `submit_training(dependency)`
    submits the array and returns its ids. The ids of each step."""
    data = submit_data(plan.manifest_path, scripts, hold)
    train_ids = submit_training(f"afterok:{data}" if data else None)
    report_id = submit_report(plan.manifest_path, str(scripts["report"]), train_ids)
    return {**({"data": [data]} if data else {}), "training": train_ids, "report": [report_id]}


def submit_data(manifest_path: Path, scripts: dict[str, Path], hold: bool) -> str | None:
    """The data step submitted (held with --hold) and recorded; its id, None for a chain without one."""
    if "data" not in scripts:
        return None
    job_id = slurm_cli.sbatch(str(scripts["data"]), ["--hold"] if hold else None)
    manifest_mod.record_submission(manifest_path, "sbatch", job_id, [], role="data", script=str(scripts["data"]))
    return job_id


def submit_report(manifest_path: Path, script: str, after: list[str]) -> str:
    """The report step submitted to start once every job of `after` has ended (at once when none), and
    recorded; its id."""
    job_id = slurm_cli.sbatch(script, [f"--dependency=afterany:{':'.join(after)}"] if after else None)
    manifest_mod.record_submission(manifest_path, "sbatch", job_id, [], role="report", script=script)
    return job_id
