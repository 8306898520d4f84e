"""The one place that talks to Slurm's commands: sbatch, squeue, sacct, scontrol, scancel.

Every call has a timeout; a missing command or a failed call gives a clear error or None (for the
queries), so that status falls back from sacct (accounting) to squeue to what the run directory says.

Three reasons for no answer are told apart in every message: no Slurm commands on this machine; the controller
(slurmctld) does not answer, asked first with `scontrol ping`, which says so at once where every other command
waits out Slurm's message timeout; accounting (slurmdbd or its database) does not answer. The last two pass
(a restart, a failover, maintenance): commands that need them refuse with SlurmAway, whose exit status says
"try again".
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tinygpt.launch.errors import LaunchError, SlurmAway

TIMEOUT_S = 30
_UNREACHABLE = "Unable to contact slurm controller"  # (Slurm's words for a connection to it that failed)
NO_COMMANDS = "no Slurm commands on this machine (scontrol is not on PATH)"
AGAIN = "try again in a minute"  # (what every SlurmAway says)
RETRY = f"nothing was written or submitted; {AGAIN}"


@dataclass(frozen=True)
class JobState:
    job_id: str  # e.g. 1234_0 for an array task
    state: str  # COMPLETED, RUNNING, PENDING, ...
    restarts: int | None
    source: str  # "sacct" or "squeue"
    reason: str = ""
    nodes: str = ""  # where its latest life ran (Slurm's node list), "" when not known
    starts: str = ""  # a pending job's expected start (squeue's %S), "" when Slurm has no estimate


def available() -> bool:
    return shutil.which("sbatch") is not None


def _run(cmd: list[str], timeout: float = TIMEOUT_S, input: str | None = None) -> subprocess.CompletedProcess | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, input=input)
    except (OSError, subprocess.SubprocessError):
        return None


def outside_a_job() -> dict[str, str]:
    """This environment without the job's own SLURM_* variables: a job submitted from inside another (a sweep's
    supervisor, an salloc shell) would take them as its own (the job's SLURM_MEM_PER_CPU beside the new one's
    --mem makes its srun refuse to start)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}


def sbatch(script_path: str, extra: list[str] | None = None) -> str:
    """Submit a script with `sbatch --parsable`; return the job id. Errors carry sbatch's own message."""
    if shutil.which("sbatch") is None:
        raise LaunchError("sbatch is not on PATH: submit from a login node of the cluster, or use --local "
                          "(or --dry-run to only write the scripts)")
    try:
        out = subprocess.run(["sbatch", "--parsable", *(extra or []), script_path], capture_output=True,
                             text=True, timeout=120, env=outside_a_job())
    except subprocess.TimeoutExpired:
        raise LaunchError(f"sbatch {script_path} did not answer within 120 s; is slurmctld up?") from None
    if out.returncode != 0:
        message = (out.stderr or out.stdout).strip() or f"exit status {out.returncode}"
        if _UNREACHABLE in message:
            raise SlurmAway(f"sbatch {script_path}: {controller_silence() or message}; {AGAIN}")
        raise LaunchError(f"sbatch rejected {script_path}: {message}")
    job_id = out.stdout.strip().split(";")[0]
    if not job_id:
        raise LaunchError(f"sbatch gave no job id for {script_path}: {out.stderr.strip()}")
    return job_id


def sbatch_test_only(script_path: str, extra: list[str] | None = None) -> tuple[bool, str]:
    """`sbatch --test-only`: whether Slurm would take the script, and its words (`would start at T using ... on
    nodes ... in partition P`; or why not). Nothing is submitted: the job id Slurm names is no job's, and is left
    out."""
    out = _run(["sbatch", "--test-only", *(extra or []), script_path], timeout=30)
    if out is None:
        return False, "sbatch is not on PATH or did not answer"
    said = " ".join((out.stderr + out.stdout).split()).replace("sbatch: ", "")
    return out.returncode == 0, re.sub(r"^Job [0-9]+ to start", "would start", said)


def scancel(job_ids: list[str], signal: str | None = None) -> tuple[bool, str]:
    if not job_ids:
        return True, "nothing to cancel"
    cmd = ["scancel", *([f"--signal={signal}"] if signal else []), *job_ids]
    out = _run(cmd)
    if out is None:
        return False, "scancel is not on PATH or did not answer"
    return out.returncode == 0, (out.stderr or out.stdout).strip()


def _slurm_conf() -> dict[str, str]:
    """This machine's slurm.conf as {key in lower case: its first value}; {} where there is none (a configless
    site's login node gets its configuration from the controller)."""
    try:
        text = Path(os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf").read_text(errors="replace")
    except OSError:
        return {}
    conf: dict[str, str] = {}
    for line in text.splitlines():
        key, eq, value = line.split("#", 1)[0].partition("=")
        if eq and value.strip():
            conf.setdefault(key.strip().lower(), value.split()[0])
    return conf


def _daemon(name: str, host: str | None, port: str) -> str:
    """`slurmctld on vm (10.77.0.1), port 6817`: `SlurmctldHost=vm(10.77.0.1)` as words."""
    if not host:
        return name
    host = re.sub(r"\((.*)\)$", r" (\1)", host)
    return f"{name} on {host}, port {port}"


def controller_silence() -> str | None:
    """None when the controller answers; else why not, in words: NO_COMMANDS, or the controller named (its
    host and port where this machine's slurm.conf says them) as not answering."""
    if shutil.which("scontrol") is None:
        return NO_COMMANDS
    out = _run(["scontrol", "ping"], timeout=5)
    if out is not None and (out.returncode == 0 or " is UP" in out.stdout):  # (a backup controller answers)
        return None
    conf = _slurm_conf()
    pinged = re.findall(r" at (\S+) is DOWN", out.stdout if out else "")
    host = conf.get("slurmctldhost") or conf.get("controlmachine") or (pinged[0] if pinged else None)
    return f"the Slurm controller ({_daemon('slurmctld', host, conf.get('slurmctldport', '6817'))}) does not answer"


def require_controller() -> None:
    """Return when the controller answers (or this machine has no Slurm commands: the caller's own call says
    so); else SlurmAway at once."""
    silence = controller_silence()
    if silence not in (None, NO_COMMANDS):
        raise SlurmAway(f"{silence}: it may be restarting; {RETRY}")


_SLURMDBD = "accounting_storage/slurmdbd"


def no_answer() -> str:
    """Why scontrol's queries gave nothing, when the controller answered its ping: NO_COMMANDS, or that they
    failed."""
    return NO_COMMANDS if shutil.which("scontrol") is None else "Slurm does not answer here (scontrol failed)"


def accounting_silence() -> str | None:
    """Why sacct or sacctmgr gave no answer, in words: None where this cluster keeps no accounting (its
    slurm.conf says so), else accounting named as not answering."""
    conf = _slurm_conf()
    if shutil.which("sacct") is None or (conf and conf.get("accountingstoragetype", "none") != _SLURMDBD):
        return None
    daemon = _daemon("slurmdbd", conf.get("accountingstoragehost"), conf.get("accountingstorageport", "6819"))
    return f"Slurm's accounting ({daemon}, or its database) does not answer"


def cluster_config() -> dict[str, str] | None:
    """`scontrol show config` as {key: value}; None when no Slurm answers."""
    out = _run(["scontrol", "show", "config"], timeout=10)
    if out is None or out.returncode != 0:
        return None
    pairs = (line.partition("=") for line in out.stdout.splitlines())
    return {key.strip(): value.strip() for key, eq, value in pairs if eq}


# `scontrol -o show node` puts a record on a line, `Key=Value` pairs apart; a value may hold spaces (OS=Linux 6.1
# #1 SMP), so a pair ends where the next `Key=` begins.
_PAIR = re.compile(r"(\w+)=(.*?)(?=\s+\w+=|\s*$)")


def scontrol_records(kind: str) -> list[dict[str, str]] | None:
    """`scontrol -o show partition|node` as one {key: value} a record; None when no Slurm answers."""
    out = _run(["scontrol", "-o", "show", kind], timeout=10)
    if out is None or out.returncode != 0:
        return None
    return [dict(_PAIR.findall(line)) for line in out.stdout.splitlines() if line.strip()]


def associations(user: str) -> tuple[str | None, list[dict[str, str]]] | None:
    """The user's default account and their associations ({Account, QOS, DefaultQOS}) in accounting; None when
    sacctmgr does not answer (no accounting, or no sacctmgr here)."""
    assoc = sacctmgr(["show", "assoc", f"user={user}", "format=Account,QOS,DefaultQOS"])
    default = sacctmgr(["show", "user", user, "format=DefaultAccount"])
    if assoc is None or default is None:
        return None
    rows = [dict(zip(("Account", "QOS", "DefaultQOS"), line.split("|"))) for line in assoc.splitlines()
            if line.strip()]
    return default.strip() or None, rows


def qos_max_wall() -> dict[str, str] | None:
    """{QOS: its MaxWall, '' for none} from accounting; None when sacctmgr does not answer."""
    out = sacctmgr(["show", "qos", "format=Name,MaxWall"])
    return None if out is None else dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


def sacctmgr(words: list[str]) -> str | None:
    """`sacctmgr -n -P WORDS`'s rows, as printed; None when accounting does not answer."""
    out = _run(["sacctmgr", "-n", "-P", *words], timeout=10)
    return out.stdout if out is not None and out.returncode == 0 else None


def squeue_count(options: tuple[str, ...]) -> int | None:
    """How many jobs `squeue -r OPTIONS` lists (each array task one); None when the controller does not answer."""
    out = _run(["squeue", "-h", "-r", "-o", "%i", *options])
    return len(out.stdout.split()) if out is not None and out.returncode == 0 else None


def cluster_name() -> str | None:
    return (cluster_config() or {}).get("ClusterName")


def max_array_size(cluster: str | None) -> int | None:
    """MaxArraySize of the reachable Slurm, when it is the cluster named `cluster` (its ClusterName)."""
    config = cluster_config()
    if not config or cluster is None or config.get("ClusterName") != cluster:
        return None
    value = config.get("MaxArraySize", "")
    return int(value) if value.isdigit() else None


def sacct_states(job_ids: list[str], since: float | None = None) -> dict[str, JobState] | None:
    """{job id: state} from accounting (array tasks as `<array>_<task>`); None when accounting is off.

    since: a Unix time before the jobs were submitted; older records that reuse the same ids (a
    controller whose state was wiped starts counting again) are left out.
    """
    if not job_ids:
        return {}
    # -D lists every life of a requeued job, each in the state it ended in (PREEMPTED, NODE_FAIL, REQUEUED):
    # restarts = lives - 1, and the job's state is its latest life's, the one submitted last (a requeue
    # submits the job again), whatever order the rows come in.
    out = _run(["sacct", "-X", "-n", "-P", "-D", *_window(since), "-j", ",".join(job_ids),
                "-o", "JobID,State,NodeList,Submit"])
    if out is None or out.returncode != 0:
        return None
    lives: dict[str, list[tuple[str, str, str]]] = {}
    for line in out.stdout.splitlines():
        parts = line.split("|")
        if len(parts) >= 4 and parts[1]:
            nodes = "" if parts[2].startswith("None") else parts[2]
            lives.setdefault(parts[0], []).append((parts[3], parts[1].split()[0], nodes))
    states: dict[str, JobState] = {}
    for job_id, history in lives.items():
        # (ISO times sort as text; the stable sort keeps sacct's order between lives submitted in one second)
        _, state, nodes = sorted(history, key=lambda life: life[0])[-1]
        for one in expand_array_id(job_id):
            states[one] = JobState(one, state, len(history) - 1, "sacct", nodes=nodes)
    return states


def _window(since: float | None) -> list[str]:
    """sacct's start time, a little before `since` (older records may reuse the same job ids)."""
    return ["-S", time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since - 120))] if since else []


def sacct_fields(job_ids: list[str], fields: tuple[str, ...], since: float | None = None) -> str | None:
    """sacct's `-P -n` lines of the jobs and their steps (array ids expand to every task's latest life);
    None when accounting is off."""
    out = _run(["sacct", "-n", "-P", *_window(since), "-j", ",".join(job_ids), "-o", ",".join(fields)])
    return out.stdout if out is not None and out.returncode == 0 else None


def expand_array_id(job_id: str) -> list[str]:
    """`123_[0-3,7%2]` (a pending array, as sacct and squeue print it) -> 123_0 ... 123_3, 123_7."""
    m = re.fullmatch(r"(\d+)_\[([^\]]+)\]", job_id)
    if not m:
        return [job_id]
    ids = []
    for part in m.group(2).split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            ids += [f"{m.group(1)}_{i}" for i in range(int(lo), int(hi or lo) + 1)]
    return ids


def squeue_states(job_ids: list[str]) -> dict[str, JobState] | None:
    """{job id: state} of jobs still known to the controller, those that have ended too (for MinJobAge after
    their end); None when squeue is unavailable."""
    if not job_ids:
        return {}
    # (-O, not -o: only --Format has the restart count; `:0` is a field at its full width)
    out = _run(["squeue", "-h", "-r", "-t", "all", "-j", ",".join(job_ids),
                "-O", "JobArrayID:0|,State:0|,Reason:0|,NodeList:0|,StartTime:0|,RestartCnt:0|"])
    if out is None:
        return None
    if out.returncode != 0:
        # squeue errors on ids it has forgotten: those jobs are simply not in the queue any more.
        return {} if "Invalid job id" in out.stderr else None
    states: dict[str, JobState] = {}
    for line in out.stdout.splitlines():
        job_id, state, reason, nodes, start, restarts = (line.split("|") + [""] * 6)[:6]
        if state:
            starts = start.strip() if state == "PENDING" and start.strip() not in ("N/A", "Unknown") else ""
            count = int(restarts) if restarts.isdigit() else None
            for one in expand_array_id(job_id):
                states[one] = JobState(one, state, count, "squeue", reason, nodes, starts)
    return states
