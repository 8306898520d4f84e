"""How many jobs this user may have in Slurm's queue: the submission limits of their association and QOS, read
from accounting (`sacctmgr show assoc`, `show qos`), and the jobs each limit counts now (`squeue -r`: each array
task is one job, as Slurm counts them).

A submit limit (MaxSubmitJobs and its kin) refuses a job over it at `sbatch`; a run limit (MaxJobs, MaxTRESPerUser)
leaves it pending, so a sweep under one still completes and only waits. Read: the user's association with the
account (MaxSubmit, MaxJobs), the account's own (GrpSubmit, GrpJobs), the job's QOS and the partition's QOS
(MaxSubmitPU, MaxSubmitPA, GrpSubmit, MaxJobsPU, MaxJobsPA, GrpJobs, MaxTRESPU). Not read: limits of the
accounts above the user's in the tree, and the cluster's MaxJobCount (shared by every user): a submission they
refuse is still refused with Slurm's words.
"""

from __future__ import annotations

import getpass
from dataclasses import dataclass
from typing import Literal

from tinygpt.launch.slurm import slurm_cli

Kind = Literal["submit", "run"]
# sbatch's words for a job over a submit limit (QOSMaxSubmitJobPerUserLimit, AssocMaxSubmitJobLimit, ...)
_OVER_A_SUBMIT_LIMIT = ("SubmitJob", "Job violates accounting/QOS policy (job submit limit")

# (sacctmgr's column, what it limits, whose jobs it counts as squeue selects them)
_QOS_COLUMNS = (("MaxSubmitPU", "submit", "user"), ("MaxSubmitPA", "submit", "account"), ("GrpSubmit", "submit", "qos"),
                ("MaxJobsPU", "run", "user"), ("MaxJobsPA", "run", "account"), ("GrpJobs", "run", "qos"),
                ("MaxTRESPU", "run", "user"))
_ASSOC_COLUMNS = (("MaxSubmit", "submit", "user"), ("MaxJobs", "run", "user"))
_ACCOUNT_COLUMNS = (("GrpSubmit", "submit", "account"), ("GrpJobs", "run", "account"))


@dataclass(frozen=True)
class Limit:
    """One limit on the user's jobs: `where` names it as Slurm does (`QOS normal MaxSubmitPU`)."""

    where: str
    value: str  # a count, or a TRES list (MaxTRESPU: cpu=8,gres/gpu=2)
    kind: Kind
    counts: tuple[str, ...]  # squeue's options selecting the jobs it counts

    @property
    def jobs(self) -> int | None:
        """The number of jobs it allows; None for a TRES limit."""
        return int(self.value) if self.value.isdigit() else None

    def __str__(self) -> str:
        return f"{self.where}={self.value}"


def read(account: str | None, qos: list[str]) -> list[Limit] | None:
    """The limits on this user's jobs of `account` (their default account when None) under the QOS `qos` (the
    job's and its partition's); None when accounting does not answer."""
    user = getpass.getuser()
    account = account or _default_account(user)
    if account is None:
        return None
    assoc = _sacctmgr(["show", "assoc", f"accounts={account}"], ("User",) + _names(_ASSOC_COLUMNS + _ACCOUNT_COLUMNS))
    by_qos = _sacctmgr(["show", "qos", f"names={','.join(qos)}"], ("Name",) + _names(_QOS_COLUMNS)) if qos else []
    if assoc is None or by_qos is None:
        return None
    counted = {"user": ("-u", user, "-A", account), "account": ("-A", account)}
    limits = []
    for row in assoc:
        if row["User"] in (user, ""):
            mine = row["User"] == user
            who, columns = (f"association {user}@{account}", _ASSOC_COLUMNS) if mine else \
                (f"account {account}", _ACCOUNT_COLUMNS)
            limits += [Limit(f"{who} {c}", row[c], kind, counted[whose]) for c, kind, whose in columns if row[c]]
    for row in by_qos:
        name = row["Name"]
        counted_q = {"user": ("-u", user, "-q", name), "account": ("-A", account, "-q", name), "qos": ("-q", name)}
        limits += [Limit(f"QOS {name} {c}", row[c], kind, counted_q[whose]) for c, kind, whose in _QOS_COLUMNS
                   if row[c]]
    return limits


def room(limits: list[Limit]) -> tuple[int | None, Limit | None]:
    """How many more jobs the submit limits allow now, and the tightest of them; (None, None) with none.
    SlurmAway when the controller does not answer a count (a guard never guesses)."""
    best: tuple[int | None, Limit | None] = (None, None)
    for limit in limits:
        if limit.kind != "submit" or limit.jobs is None:
            continue
        counted = slurm_cli.squeue_count(limit.counts)  # (each array task one: pending, running, completing)
        if counted is None:
            from tinygpt.launch.errors import SlurmAway

            raise SlurmAway(f"squeue did not answer how many jobs {limit.where} counts now; {slurm_cli.AGAIN}")
        left = limit.jobs - counted
        if best[0] is None or left < best[0]:
            best = (left, limit)
    return best


def over_a_submit_limit(said: str) -> bool:
    """Whether sbatch refused a job (its words `said`) for a submit limit: it takes the job once others leave."""
    return any(words in said for words in _OVER_A_SUBMIT_LIMIT)


def _names(columns: tuple[tuple[str, str, str], ...]) -> tuple[str, ...]:
    return tuple(c for c, _, _ in columns)


def _default_account(user: str) -> str | None:
    rows = _sacctmgr(["show", "user", user], ("DefaultAccount",))
    return rows[0]["DefaultAccount"] or None if rows else None


def _sacctmgr(words: list[str], columns: tuple[str, ...]) -> list[dict[str, str]] | None:
    """sacctmgr's rows of `columns`, each a {column: value}; None when accounting does not answer."""
    done = slurm_cli.sacctmgr([*words, f"format={','.join(columns)}"])
    return None if done is None else [dict(zip(columns, line.split("|"))) for line in done.splitlines() if line]
