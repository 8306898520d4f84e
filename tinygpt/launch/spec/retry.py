"""A spec's `retry:` (and a profile's default): which ends of a run its sweep's heal job sends again, how.

    retry:
      rounds: 3                      # at most this many rounds after the first (0: none)
      ends: [time_limit, out_of_memory, node_failure, hung, preempted]   # the ends retried (default: all five)
      time_factor: 2                 # a run that met its time limit asks for this much more time ...
      max_time: "04:00:00"           # ... up to this (default: its partition's MaxTime)
      mem_factor: 2                  # a run that ran out of memory asks for this much more memory ...
      max_mem: 64G                   # ... up to this (default: a node's memory, as the profile says)
      mem_from_peak: 1.5             # right-sizing: a run sent again asks for its measured peak x this
      notify:                        # one summary when the last round has ended
        mail: me@example.org         # Slurm's own mail (--mail-type=END) of a one-line job named by the summary
        command: [curl, -sS, --data-binary, "@{summary}", "https://hooks.example.org/x"]

A failure of the program itself (a Python error, bad data, a NaN loss: it ended with an error of its own) and a
run cancelled by a person are never retried: they are not among the kinds `ends` takes. `notify.command` is
started with these words, never through a shell, on the compute node where the sweep's last heal job
runs (many clusters' nodes reach no internet: point it at something they reach); `{summary}` is the summary's
path, `{sweep}` the sweep's name, `{headline}` its first line. The heal job (heal/heal_pass.py) does the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator

from tinygpt.base import schema
from tinygpt.base.schema import Int, OptFloat, OptText, Text
from tinygpt.launch.spec.command import check_words
from tinygpt.launch.spec.resources import MemMB, Resources, SlurmTime


@dataclass(frozen=True)
class EndKind:
    """One way a run ends, in a retry policy's words: its one declaration. Slurm's job states that say it (an end
    told apart by the run's log as well is read in heal/ends.py), what a retry changes, or why it is never retried."""

    name: str
    states: tuple[str, ...]
    retried: str | None = None  # what a retry changes, in words; None: not retried
    never: str | None = None  # why a policy may not retry it
    away_from_its_nodes: bool = False  # a retry (and resubmit --exclude-failed-nodes) keeps off the nodes it ended on


ENDS = {k.name: k for k in (
    EndKind("finished", ("COMPLETED", "FINISHED", "PRUNED")),
    EndKind("time_limit", ("TIMEOUT",), retried="more time"),
    EndKind("out_of_memory", ("OUT_OF_MEMORY",), retried="more memory"),
    EndKind("node_failure", ("NODE_FAIL", "BOOT_FAIL"), retried="without the nodes that failed",
            away_from_its_nodes=True),
    EndKind("hung", ("HUNG",), retried="without the nodes of its silent ranks", away_from_its_nodes=True),
    EndKind("preempted", ("PREEMPTED",), retried="as it was"),
    EndKind("cancelled", ("CANCELLED", "DEADLINE"), never="cancelled by a person"),
    EndKind("program", ("FAILED",), never="a failure of the program itself"),
)}
KINDS = {k.name: k.retried for k in ENDS.values() if k.retried}  # the ends a policy may retry: what a retry changes
NEVER = {k.name: k.never for k in ENDS.values() if k.never}
NOTIFY_VALUES = ("summary", "sweep", "headline")
MAX_ROUNDS = 100


class Notify(schema.Schema):
    """Where the sweep's summary goes when its last round has ended."""

    mail: OptText = Field(None, description=(
        "an address for Slurm's own mail: a one-line job named by the summary ends with --mail-type=END"))
    command: list[Text] | None = Field(None, min_length=1, description=(
        "a program and its words, run where the last heal job runs (a compute node): {summary} is the "
        "summary's path, {sweep} the sweep's name, {headline} its first line; never through a shell"))

    @field_validator("mail")
    @classmethod
    def _an_address(cls, mail: str | None) -> str | None:
        if mail is not None and (not mail.strip() or mail.startswith("-") or any(
                ch.isspace() or ch in "\x00'\"`$;|&<>\\" for ch in mail)):
            raise ValueError(f"{mail!r} is not a mail address for sbatch --mail-user; give e.g. me@example.org")
        return mail

    @field_validator("command")
    @classmethod
    def _words(cls, argv: list[str] | None) -> list[str] | None:
        return None if argv is None else check_words(argv, "command", NOTIFY_VALUES)


class RetryPolicy(schema.Schema):
    """How a sweep's heal job sends again the runs that ended badly, by how they ended."""

    rounds: Int = Field(3, ge=0, le=MAX_ROUNDS, description="at most this many rounds after the first (0: none)")
    ends: list[Literal[tuple(KINDS)]] = Field(list(KINDS), description=(
        f"the ends retried: {', '.join(KINDS)} (a failure of the program itself never is)"))
    time_factor: float = Field(2.0, gt=1, le=100, description="a run that met its time limit asks for this much "
                                                                "more time, up to max_time")
    max_time: SlurmTime = Field(None, description="the most time a retried run asks for (default: its partition's "
                                                  "MaxTime)")
    mem_factor: float = Field(2.0, gt=1, le=100, description="a run that ran out of memory asks for this much more, "
                                                               "up to max_mem")
    max_mem: MemMB = Field(None, description="the most memory a retried run asks for (default: a node's, as the "
                                             "profile says)")
    mem_from_peak: OptFloat = Field(None, ge=1, le=100, description=(
        "right-sizing: a run sent again asks for its measured peak memory x this (never less than it needed)"))
    notify: Notify | None = Field(None, description="where the summary goes at the end: mail, command")

    @classmethod
    def of(cls, recorded: dict | None) -> RetryPolicy | None:
        """The policy a manifest records (its `retry`), or None for none."""
        return cls.model_validate(recorded) if recorded else None

    def right_size(self, peak_mem_mb: float | None) -> int | None:
        """The memory a run asks for next by its measured peak (mem_from_peak), in MB; None: not measured or not
        asked for."""
        if peak_mem_mb is None or not self.mem_from_peak:
            return None
        return max(1, math.ceil(peak_mem_mb * self.mem_from_peak))

    @field_validator("ends", mode="before")
    @classmethod
    def _never_the_program(cls, ends):
        for kind in ends if isinstance(ends, list) else []:
            if kind in NEVER:
                raise ValueError(f"`{kind}` ({NEVER[kind]}) is never retried; retry any of {', '.join(KINDS)}")
        return ends

    @field_validator("max_time")
    @classmethod
    def _finite(cls, minutes: int | None) -> int | None:
        if minutes is not None and minutes < 1:
            raise ValueError("give a finite time of at least one minute (e.g. '04:00:00'), or leave it out for "
                             "the partition's MaxTime")
        return minutes


def resolve(spec: RetryPolicy | None, profile: RetryPolicy | None, resources: Resources, limits: tuple,
            problems: list[str], profile_name: str = "the profile") -> RetryPolicy | None:
    """The sweep's policy: the spec's keys over the profile's, its caps filled in from `limits` (the partition's
    MaxTime, a node's memory, each None where unknown) and checked against them; None for no retries. A problem
    with a key the profile gave names the profile, and how a spec sets it or turns the policy off."""
    if spec is None and profile is None:
        return None
    from_spec = spec.model_dump(exclude_unset=True) if spec else {}
    policy = RetryPolicy.model_validate({**(profile.model_dump(exclude_unset=True) if profile else {}), **from_spec})
    if policy.rounds == 0:
        return None

    def refuse(key: str, why: str) -> None:
        where = "" if key in from_spec else (f" (from {profile_name}'s retry:; set retry.{key} in the spec, or "
                                             f"turn retries off for this sweep with retry: {{rounds: 0}})")
        problems.append(f"retry.{key}: {why}{where}")
    max_time, max_mem = limits
    if policy.max_time is not None and max_time is not None and policy.max_time > max_time:
        refuse("max_time", f"{policy.max_time} is over the MaxTime {max_time} of "
                           f"partition `{resources.partition}`; ask for at most that")
    if policy.max_mem is not None and max_mem is not None and policy.max_mem > max_mem:
        refuse("max_mem", f"{policy.max_mem} MB is more than the {max_mem} MB of a node; ask for at most that")
    if policy.max_time is not None and policy.max_time < resources.time:
        refuse("max_time", f"{policy.max_time} is less than resources.time {resources.time}; a retry "
                           f"never asks for less")
    if policy.max_mem is not None and resources.mem_mb is not None and policy.max_mem < resources.mem_mb:
        refuse("max_mem", f"{policy.max_mem} MB is less than resources.mem {resources.mem_mb} MB; a retry never "
                          f"asks for less")
    return policy.model_copy(update={"max_time": policy.max_time or max_time, "max_mem": policy.max_mem or max_mem})
