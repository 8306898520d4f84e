"""A retry policy's small jobs (spec/retry.py): the sweep's heal job and the summary's mail.

    <sweep>-heal     one small task after a round's jobs (--dependency=afterany): `launch.py heal` reads how
                     each run ended, sends again what the policy allows as the next round, and submits itself
                     again after that round; after the last, it writes the summary and sends it
    <sweep>-notify   one small task that prints the summary, named by its headline, with Slurm's own mail at
                     its end (--mail-type=END): submitted once, by the last heal job, where notify.mail says

Both scripts are written at launch, beside the array's, and ask for what a chain's steps ask for (chain.py): one
CPU, no GPU, the sweep's partition and account, at most an hour.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from typing import TYPE_CHECKING

from tinygpt.base import durable
from tinygpt.launch import manifest as manifest_mod
from tinygpt.launch.errors import LaunchError, SlurmAway
from tinygpt.launch.layout import STEP_LOG_PATTERN
from tinygpt.launch.slurm import limits, slurm_cli
from tinygpt.launch.submit.chain import STEP_MAX
from tinygpt.launch.submit.sbatch import render_step
from tinygpt.launch.submit.slurm_options import container_prefix

if TYPE_CHECKING:
    from tinygpt.launch.manifest import Manifest
    from tinygpt.launch.submit.plan import Plan

HEAL, NOTIFY = "heal", "notify"  # the jobs' roles in the manifest's submissions
BACK_OFF_S = 30.0  # between two tries of a heal job Slurm refused for a submit limit
JOB_NAME_MAX = 120  # characters of the headline the summary's job is named by (the mail's subject)


def write_scripts(plan: Plan) -> None:
    """The heal job's and the summary's batch scripts, for a sweep with a retry policy."""
    sweep = plan.sweep
    small = dataclasses.replace(sweep.resources, nodes=1, gpus_per_node=0, tasks_per_node=1, cpus_per_task=1,
                                mem_mb=None, time=min(sweep.resources.time, STEP_MAX), srun_args=(),
                                # (any node may run the heal job: the runs' excluded ones are theirs)
                                named={k: v for k, v in sweep.resources.named.items() if k != "exclude"})
    python = f'{container_prefix(sweep.profile)}"$PYTHON"'
    q = shlex.quote
    commands = {HEAL: [f"{python} -m tinygpt.launch.commands.cli heal {q(str(plan.manifest_path))}"],
                NOTIFY: [f"cat {q(str(sweep.dirs.summary))}"]}
    for step, lines in commands.items():
        text = render_step(f"{sweep.name}-{step}", lines, small, sweep.profile, str(plan.workdir),
                           str(plan.logs_dir / STEP_LOG_PATTERN.format(step=step)), plan.python, str(plan.code),
                           of="a sweep's retry policy")
        durable.write(sweep.dirs.step_script(step), text)


def heal_jobs(manifest: Manifest) -> list[str]:
    """The ids of the sweep's heal jobs, oldest first."""
    return [s.job_id for s in manifest.submissions if s.role == HEAL]


def after_all(job_ids: list[str]) -> list[str]:
    """The heal job's sbatch options to start once every job of `job_ids` has ended."""
    return [f"--dependency=afterany:{':'.join(job_ids)}"]


def submit(manifest: Manifest, when: list[str], round: int) -> str:
    """The heal job of round `round`, to start as its sbatch options `when` say (after_all, or waves'
    after_the_first_of); its id."""
    script = manifest.dirs.step_script(HEAL)
    job_id = slurm_cli.sbatch(str(script), when)
    manifest_mod.record_submission(manifest.path, "sbatch", job_id, [], role=HEAL, round=round, script=str(script))
    return job_id


def submit_until_taken(manifest: Manifest, when: list[str], round: int, wait_s: float = BACK_OFF_S) -> str:
    """`submit`, tried again every `wait_s` seconds while Slurm refuses it for a submit limit (one lowered under
    the jobs the user has queued: they leave the queue meanwhile, and this job's own place goes with it); its id."""
    while True:
        try:
            return submit(manifest, when, round)
        except SlurmAway:
            raise
        except LaunchError as err:
            if not limits.over_a_submit_limit(str(err)):
                raise
            print(f"heal: the next heal job is over a limit now ({err}); trying again in {wait_s:.0f} s", flush=True)
            time.sleep(wait_s)


def mail(manifest: Manifest, headline: str, address: str) -> str:
    """The summary's job, named by `headline`, with Slurm's mail to `address` at its end; its id."""
    script = manifest.dirs.step_script(NOTIFY)
    job_id = slurm_cli.sbatch(str(script), [f"--job-name={headline[:JOB_NAME_MAX]}", "--mail-type=END",
                                            f"--mail-user={address}"])
    manifest_mod.record_submission(manifest.path, "sbatch", job_id, [], role=NOTIFY, script=str(script))
    return job_id


def job_state(job: str) -> str:
    """A heal job's state as `status` says it: `PENDING (Dependency)`."""
    queued = (slurm_cli.squeue_states([job]) if slurm_cli.controller_silence() is None else None) or {}
    states = {**(slurm_cli.sacct_states([job]) or {}), **queued}  # (the controller's word, with its reason, first)
    found = states.get(job)
    if found is None:
        return "(Slurm does not say)"
    return found.state + (f" ({found.reason})" if found.reason and found.reason != "None" else "")
