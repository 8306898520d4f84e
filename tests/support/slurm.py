"""Submitting to and waiting on the real local Slurm cluster from tests."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.support.paths import ROOT
from tests.support.processes import launch, python_env, slow_saves, wait_until
from tests.support.sweeps import sweep_dirs
from tests.support.tiny import read_metrics

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
            "DEADLINE"}

SESSION_START = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 120))


def unique_name(prefix: str) -> str:
    return f"tg-{prefix}-{uuid.uuid4().hex[:6]}"


def manifest_of(workdir: Path, name: str):
    """The manifest of sweep `name` launched under `workdir`."""
    from tinygpt.launch.manifest import load

    return load(sweep_dirs(workdir, name).manifest)


def launched(spec: Path, workdir: Path, env: dict[str, str] | None = None):
    """Launch the spec (its jobs submitted, with `env` on top of ours); its manifest."""
    from tinygpt.launch.spec.sweep import load_name

    out = launch(str(spec), "--workdir", str(workdir), env=env)
    assert out.returncode == 0, out.stderr
    return manifest_of(workdir, load_name(spec))


def reference(cfg) -> Path:
    """The uninterrupted run of trainer config `cfg`, trained in this process: what a resumed one must equal."""
    from tinygpt.training import trainer

    trainer.train(cfg)
    return Path(cfg.run.out_dir)


def events(run_dir: Path, kind: str | None = None) -> list[dict]:
    """The run's event records (of one `kind`, e.g. "preempted")."""
    return [r for r in read_metrics(run_dir) if "event" in r and kind in (None, r["event"])]


def job_env(**extra: str) -> dict[str, str]:
    """The environment a submitted job inherits (sbatch exports it): the repository importable, offline."""
    return python_env(**extra)


def sbatch(*args: str, script: str | None = None, cwd: Path | None = None, env: dict | None = None) -> str:
    """Submit with `sbatch --parsable`; return the job id (raises with sbatch's message on failure)."""
    out = subprocess.run(["sbatch", "--parsable", *args], input=script, capture_output=True, text=True,
                         cwd=cwd, env=env or job_env(), timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"sbatch failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout.strip().split(";")[0]


def queued(name: str) -> list[str]:
    """The ids of the jobs named `name` in the queue (a sweep's jobs carry its name; other tests' jobs may come and
    go, so the whole queue is no measure). A squeue that fails raises: an empty answer is never taken for none."""
    out = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"squeue failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout.split()


def take_every_node() -> str:
    """A job of partition `high` that needs every CPU of both nodes: Slurm preempts whatever runs there (the local
    cluster's `up.sh --preemption`: `low` is requeued, `low-cancel` cancelled)."""
    return sbatch("-p", "high", "-N", "2", "--ntasks-per-node", "1", "-c", "2", "-J", unique_name("high"),
                  "-o", "/dev/null", "--wrap", "sleep 1")


def scontrol_state(job_id: str) -> str | None:
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        return None
    for field in out.stdout.split():
        if field.startswith("JobState="):
            return field.split("=", 1)[1]
    return None


def sacct_state(job_id: str) -> str | None:
    # -S: only records of this test session, never an older job that had the same id
    out = subprocess.run(["sacct", "-S", SESSION_START, "-j", job_id, "-X", "-n", "-P", "-o", "State"],
                         capture_output=True, text=True, timeout=30)
    lines = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    return lines[0] if out.returncode == 0 and lines else None


def wait(job_id: str, timeout: float = 240.0, poll: float = 0.5) -> str:
    """Block until the job is in a terminal state; return it (scontrol first, sacct when it has aged out). A job
    still live at the timeout is cancelled."""
    def ended() -> str | None:
        state = (scontrol_state(job_id) or sacct_state(job_id) or "?").split()[0]
        return state if state in TERMINAL else None

    try:
        return wait_until(ended, timeout, poll, what=f"job {job_id} ending")
    except TimeoutError:
        cancel(job_id)
        raise


def wait_sacct(job_id: str, want: str, timeout: float = 60.0) -> str:
    """Accounting lags a little behind the controller: poll sacct until it reports `want`; what it last said
    (for the test's assertion) when it never does."""
    try:
        return wait_until(lambda: sacct_state(job_id) == want and want, timeout, 0.5, what=f"sacct saying {want}")
    except TimeoutError:
        return sacct_state(job_id) or "<none>"


def cancel(*job_ids: str) -> None:
    if job_ids:
        subprocess.run(["scancel", *job_ids], capture_output=True, timeout=30)


def python() -> str:
    return sys.executable


def train_on_two_nodes(tmp_path: Path, name: str, flags: list[str], **env: str) -> str:
    """`srun python -m tinygpt.train FLAGS` on both nodes (one rank each), with these variables added to the
    job's environment; asserts the job COMPLETED."""
    script = f"#!/bin/bash\nsrun {python()} -m tinygpt.train {' '.join(flags)}\n"
    log = tmp_path / f"{name}.out"
    job = sbatch("-J", unique_name(name), "-N", "2", "--ntasks-per-node", "1", "-o", str(log), script=script,
                 env=job_env(**env))
    try:
        assert wait(job) == "COMPLETED", log.read_text()
    finally:
        cancel(job)
    return job


def job_fields(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=30)
    if out.returncode != 0 or not out.stdout.strip():
        return {}
    return dict(f.split("=", 1) for f in out.stdout.splitlines()[0].split() if "=" in f)


def run_to_completion(job_id: str, timeout: float = 300.0) -> tuple[str, int]:
    """Wait for the end of a job that may requeue itself; release Slurm's BeginTime hold after each requeue
    (Slurm holds a requeued job for cred_expire + 1 s, 6 s on the local cluster, before it may start again).
    Returns (state, restarts)."""
    deadline = time.monotonic() + timeout
    fields: dict[str, str] = {}
    held_since = None
    while time.monotonic() < deadline:
        fields = job_fields(job_id) or fields
        state = fields.get("JobState", "")
        if state in TERMINAL:
            return state, int(fields.get("Restarts", "0"))
        if state == "PENDING" and fields.get("Reason") == "BeginTime":
            held_since = held_since or time.monotonic()
            # Release only once the previous life has left its nodes: a start while they are still
            # completing fails with "Job credential revoked" (what the hold protects against).
            completing = subprocess.run(["sinfo", "-h", "-t", "completing", "-o", "%N"], capture_output=True,
                                        text=True, timeout=30).stdout.strip()
            if not completing and time.monotonic() - held_since > 3:
                subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], capture_output=True,
                               timeout=30)
        else:
            held_since = None
        time.sleep(0.2)
    cancel(job_id)
    raise TimeoutError(f"job {job_id} did not finish within {timeout:.0f} s (last: {fields.get('JobState')})")


def training(metrics: Path, min_lines: int = 1) -> bool:
    """Whether a run's metrics show at least `min_lines` training lines (so its signal handlers are in place)."""
    try:
        return sum('"lr"' in line for line in metrics.read_text().splitlines()) >= min_lines
    except OSError:
        return False


def held_at_first_save(gate: Path) -> dict[str, str]:
    """The variables under which a job's runs each hold their first checkpoint until the file `gate` exists
    (tests/support/slow_saves): a signal sent before `signal_when_training` opens it finds them training, however
    long the test itself took to look."""
    return {**slow_saves(0), "TINYGPT_TEST_SAVE_GATE": str(gate)}


def signal_when_training(job_id: str, metrics: Path, signal: str = "USR2", min_lines: int = 5,
                         timeout: float = 120.0, gate: Path | None = None) -> None:
    """Send `signal` to the job's steps (the trainers, `signal_steps`) once its metrics show it training, then open
    `gate` (of `held_at_first_save`) if there is one."""
    wait_until(lambda: training(metrics, min_lines), timeout=timeout, poll=0.05, what=f"job {job_id} training")
    try:
        signal_steps(job_id, signal)
    finally:
        if gate is not None:
            gate.touch()


def signal_steps(job_id: str, signal: str = "USR2", timeout: float = 30.0) -> None:
    """`scancel -s SIGNAL JOB` to a running job, as Slurm sends its warning: to the job's steps. Slurm signals them
    one after another, and a program the signal ends at once (it dies of it, or saves and requeues itself) can end
    the job before the last is signalled: scancel then says "already completing or completed" (exit 229 on Slurm
    22.05) of a signal that went through, as CI's logs showed (the program's log: died of SIGUSR2).
    So a refusal once the job has left RUNNING is the signal's own doing (what follows in each test checks what it
    did); one while the job still runs sends it again; a job not running before is a failure."""
    state = job_fields(job_id).get("JobState")
    if state != "RUNNING":
        raise AssertionError(f"job {job_id} is {state}, not running: no {signal} sent")
    deadline = time.monotonic() + timeout
    while True:
        out = subprocess.run(["scancel", "-s", signal, job_id], capture_output=True, text=True, timeout=30)
        if out.returncode == 0:
            return
        state = job_fields(job_id).get("JobState")
        said = f"scancel -s {signal} {job_id}: exit {out.returncode} ({out.stderr.strip()}), the job {state} now"
        if state != "RUNNING":
            print(f"{said}: the signal ended it")
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{said}: refused for {timeout:.0f} s")
        time.sleep(0.5)


def counting_shim(tmp_path: Path, command: str) -> tuple[dict[str, str], Path]:
    """The real `command` behind a shim on PATH that appends each call's arguments to a file: (the environment
    that puts it first on PATH, that file)."""
    import os

    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    count = tmp_path / f"{command}-calls"
    real = subprocess.run(["which", command], capture_output=True, text=True).stdout.strip()
    shim = bindir / command
    shim.write_text(f'#!/bin/bash\nprintf "%s\\n" "$*" >> "{count}"\nexec {real} "$@"\n')
    shim.chmod(0o755)
    return {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}, count


def trainer_pid(task_id: str, rank: int, timeout: float = 120) -> int:
    """The pid of rank `rank` of array task `task_id` (`123_1`): the local cluster's nodes share this machine's
    processes, and each trainer's environment says its job, task and rank."""
    array, task = task_id.split("_")

    def find() -> int | None:
        for proc in Path("/proc").iterdir():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                if b"tinygpt.train" not in argv or argv[0].endswith(b"srun"):  # (srun's own line names it too)
                    continue
                env = dict(v.split("=", 1) for v in (proc / "environ").read_text().split("\0") if "=" in v)
            except (OSError, ValueError):
                continue
            if (env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID"), env.get("SLURM_PROCID")) == \
                    (array, task, str(rank)):
                return int(proc.name)
        return None

    return wait_until(find, timeout=timeout, what=f"rank {rank} of {task_id}")


def step_cpus(job_id: str, steps: int) -> dict[str, int]:
    """{step: the CPUs Slurm allocated it} of a job's numbered steps (srun's), once accounting has all `steps`."""
    def read() -> dict[str, int] | None:
        out = subprocess.run(["sacct", "-n", "-P", "-j", job_id, "-o", "JobID,AllocCPUS"], capture_output=True,
                             text=True, timeout=30).stdout
        # (a step's JobID has a dot; the job's own line may read "166" rather than "166_0" while accounting
        # has not yet heard that it is an array task)
        rows = (line.split("|") for line in out.splitlines())
        found = {step: int(cpus) for (_, dot, step), cpus in ((jid.rpartition("."), cpus) for jid, cpus in rows)
                 if dot and step.isdigit()}
        return found if len(found) >= steps else None

    return wait_until(read, timeout=60, poll=0.5, what=f"accounting of job {job_id}'s steps")


def slurm_release() -> str:
    """The release of the Slurm commands on PATH ("24.11.5": `sbatch --version` says "slurm-wlm 24.11.5")."""
    out = subprocess.run(["sbatch", "--version"], capture_output=True, text=True, timeout=30, check=True).stdout
    return re.search(r"\b\d+\.\d+\.\d+\b", out).group(0)


def in_service(name: str) -> bool:
    """Whether slurmctld has the node back (sinfo: idle, or running other tests' jobs), not down or unresponsive,
    and its slurmd has registered (a node that answers pings before that shows SlurmdStartTime=None)."""
    out = subprocess.run(["sinfo", "-h", "-n", name, "-o", "%t"], capture_output=True, text=True, timeout=30)
    states = set(out.stdout.split())
    shown = subprocess.run(["scontrol", "-o", "show", "node", name], capture_output=True, text=True, timeout=30)
    registered = shown.returncode == 0 and "SlurmdStartTime=None" not in shown.stdout
    return bool(states) and states <= {"idle", "mix", "alloc", "comp"} and registered


def node(action: str, name: str) -> None:
    """`node.sh crash|boot NAME` on a node of the local cluster."""
    done = subprocess.run(["bash", str(ROOT / "hpc_lab" / "local_cluster" / "node.sh"), action, name],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def daemon(action: str, name: str) -> None:
    """`daemon.sh stop|start NAME` (slurmctld, slurmdbd, mariadb) of the local cluster."""
    subprocess.run(["bash", str(ROOT / "hpc_lab" / "local_cluster" / "daemon.sh"), action, name], check=True,
                   capture_output=True, timeout=120)


def squeue_nodes(job_id: str) -> str:
    """The node list of a running job, '' while it is not running."""
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-t", "R", "-o", "%N"], capture_output=True, text=True,
                         timeout=30)
    return out.stdout.strip() if out.returncode == 0 else ""
