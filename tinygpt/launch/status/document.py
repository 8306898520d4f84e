"""`status --json`: a sweep's status as one JSON document, for scripts and agents. Its schema is these models
(`launch.py schema status`, committed as schemas/status.schema.json); `format` changes when a field's meaning
does, and fields are only ever added within one format.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tinygpt.launch.heal import decide, waves
from tinygpt.launch.read import log_files
from tinygpt.launch.read.run_states import collect

if TYPE_CHECKING:
    from tinygpt.launch.manifest import Manifest

FORMAT = 1


class RunStatus(BaseModel):
    """One run of the sweep, as `status` shows it."""

    model_config = ConfigDict(extra="forbid")

    index: int = Field(description="the run's number in the sweep (its array task is derived from it)")
    name: str = Field(description="the run's name")
    job: str | None = Field(description="its latest Slurm job (ARRAY_TASK), or null when never submitted")
    state: str = Field(description="the state as shown: Slurm's word (`COMPLETED`, `CANCELLED by 1000`) or the run "
                                   "directory's (`FINISHED`, `HUNG at step 120`, `NOT_STARTED`)")
    state_name: str = Field(description="the state's first word alone, e.g. RUNNING, FAILED, HUNG")
    ended: bool = Field(description="whether the state is an end (nothing will change it but a resubmission)")
    failed: bool = Field(description="whether it ended badly: what `resubmit` sends again by default")
    source: str = Field(description="where the state came from: sacct, squeue or run dir")
    restarts: int | None = Field(description="how many times Slurm requeued its job, where known")
    step: int | None = Field(description="the last step its metrics.jsonl records")
    max_steps: int | None = Field(description="the steps it trains for (null for a program of the user's)")
    train_loss: float | None
    val_loss: float | None
    tokens_per_s: float | None
    eta_s: float | None = Field(description="seconds left at its pace, while it runs")
    run_dir: str = Field(description="its directory: metrics.jsonl, checkpoints")
    nodes: str = Field(description="the nodes of its latest life, in Slurm's notation, or empty")
    history: list[str] = Field(description="its earlier submissions, oldest first: `JOB STATE on NODES`")
    starts: str | None = Field(description="when Slurm expects its pending job to start, where it says")
    round: int | None = Field(description="under a retry policy, the round of its newest job (the launch is 1)")
    error: str | None = Field(None, description="for a run that failed, the line of its latest life that says why "
                                                "(what `status` prints under its table); null otherwise")
    retry: str | None = Field(None, description="under a retry policy, what it does next with the run: send it again "
                                                "(with what) or give it up (and why), as `status` says; null otherwise")


class TrialStatus(BaseModel):
    """One trial of an Optuna search, as `status` lists it under its workers."""

    model_config = ConfigDict(extra="forbid")

    trial: int = Field(description="its number in the study")
    state: str = Field(description="Optuna's word: RUNNING, COMPLETE, PRUNED, FAIL, WAITING")
    value: float | None = Field(description="its objective (the validation loss, or seconds to the target)")
    pruned_at: int | None = Field(description="the step at which the pruner stopped it")
    last_value: float | None = Field(description="the last value it reported")
    worker: int | None = Field(description="the worker that trained it")
    params: dict[str, Any] = Field(description="the values tried")
    run_dir: str | None = Field(description="its run directory")
    tokens_to_target: int | None = Field(description="with a target: the tokens trained when it got there")


class SweepStatus(BaseModel):
    """The document `status --json` prints."""

    model_config = ConfigDict(extra="forbid")

    format: Literal[1] = Field(description="this document's format")
    sweep: str = Field(description="the sweep's name")
    manifest: str = Field(description="its manifest's path")
    cluster: str | None = Field(description="the cluster profile it was launched with")
    backend: str = Field(description="sbatch, submitit or local")
    program: Literal["trainer", "command"] = Field(description="our trainer, or a program of the user's")
    time: float = Field(description="when the document was made, seconds since the epoch")
    unheard: list[str] = Field(description="Slurm's daemons that did not answer: the states may be older than "
                                           "they look (empty when every one answered)")
    counts: dict[str, int] = Field(description="runs by state name")
    retry: list[str] = Field(description="what `status` says of its retry policy: the round, the heal job, "
                                         "what the policy does next, or the summary's headline (empty: no policy)")
    queue: list[str] = Field(description="what `status` says of the queue: runs waiting for a wave (a sweep larger "
                                         "than the queue limits), the heal job that sends them and when the last "
                                         "should go out; runs Slurm keeps pending for a limit (empty: nothing)")
    runs: list[RunStatus]
    trials: list[TrialStatus] | None = Field(None, description="an Optuna search's trials (null: not a search)")
    ended: bool = Field(False, description="whether the sweep is over: every run has ended, and a retry policy has "
                                           "written its summary or the sweep was cancelled (what `wait` waits for)")


def document(manifest: Manifest) -> SweepStatus:
    """The sweep's status now (asks Slurm, as `status` does)."""
    rows = collect(manifest)
    retry, retry_of = decide.status_lines(manifest, rows)
    runs = [RunStatus(index=r.index, name=r.name, job=None if r.job_id == "-" else r.job_id, state=str(r.state),
                      state_name=r.state.name, ended=r.state.ended, failed=r.state.failed, source=r.source,
                      restarts=r.restarts, step=r.step, max_steps=r.max_steps, train_loss=r.train_loss,
                      val_loss=r.val_loss, tokens_per_s=r.tokens_per_s, eta_s=r.eta_s, run_dir=r.run_dir,
                      nodes=r.nodes, history=list(r.history), starts=r.starts or None, round=r.round,
                      error=log_files.last_error(manifest, r.index) if r.state.failed else None,
                      retry=retry_of.get(r.index))
            for r in rows]
    return SweepStatus(format=FORMAT, sweep=manifest.name, manifest=str(manifest.path), cluster=manifest.cluster,
                       backend=manifest.backend, program="command" if manifest.command else "trainer",
                       time=time.time(), unheard=list(rows.unheard),
                       counts=dict(Counter(r.state_name for r in runs)), retry=retry,
                       queue=waves.status_lines(manifest, rows), runs=runs, trials=_trials(manifest),
                       ended=all(r.ended for r in runs) and (not manifest.retry or manifest.dirs.summary.exists()
                                                             or manifest.dirs.cancelled.exists()))


def _trials(manifest: Manifest) -> list[TrialStatus] | None:
    if not manifest.search:
        return None
    from tinygpt.launch.read import study

    return [TrialStatus(**{key.replace(" ", "_"): value for key, value in row.items()})
            for row in study.trials(manifest)]
