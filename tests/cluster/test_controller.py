"""Slurm's daemons as they fail on real clusters: the controller restarting (an upgrade, a failover) and
accounting or its database away, on the real local cluster (hpc_lab/local_cluster/daemon.sh stops and starts
each the way a site's restart does)."""

import hashlib
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tests.support.processes import launch
from tests.support.slurm import cancel, daemon, manifest_of, wait, wait_until
from tests.support.sweeps import sweep_dirs
from tests.support.tiny import read_metrics, tiny_yaml

pytestmark = pytest.mark.slurm

AWAY = 75  # errors.TRY_AGAIN, SlurmAway's exit status: try again


def nodes_ready() -> bool:
    """Every node answers the controller again (after a restart they register anew)."""
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, timeout=30)
    return out.returncode == 0 and bool(out.stdout.split()) and all(
        s.rstrip("*") in ("idle", "mix", "alloc") for s in out.stdout.split())


@pytest.fixture
def away():
    """Stop a daemon for the test (`away("slurmctld")`); every one stopped is started again however it ends."""
    stopped = []

    def stop(name: str) -> None:
        daemon("stop", name)
        stopped.append(name)

    yield stop
    for name in reversed(stopped):
        daemon("start", name)
    wait_until(nodes_ready, timeout=60, poll=0.5, what="every node answering the controller again")


def files_of(folder: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()}


def write_spec(tmp_path: Path, corpus: Path, name: str, cluster: str = "local") -> Path:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(f"name: {name}\ncluster: {cluster}\ntrain: {{data_file: {corpus}, "
                    f"{tiny_yaml(max_steps=20, eval_interval=10)}}}\nresources: {{time: '00:10:00'}}\n")
    return spec


@pytest.mark.slurm_release
def test_while_the_controller_is_away_commands_say_so_at_once_and_afterwards_answer_as_before(
        tmp_path, tiny_corpus, away):
    work = tmp_path / "work"
    held, fresh = write_spec(tmp_path, tiny_corpus, "held"), write_spec(tmp_path, tiny_corpus, "fresh")
    assert launch(str(held), "--hold", "--workdir", str(work)).returncode == 0
    job = manifest_of(work, "held").submissions[0].job_id
    before = files_of(work)
    away("slurmctld")
    for command in ([str(fresh)], [str(fresh), "--no-check"], ["check", str(fresh)], [str(held)],
                    ["cancel", str(held)], ["resubmit", str(held)]):
        out = launch(*command, "--workdir", str(work), timeout=60)
        assert out.returncode == AWAY, (command, out.stdout, out.stderr)
        said = out.stderr.strip()
        assert said.startswith("error: ") and "Traceback" not in said, said
        assert "the Slurm controller (slurmctld on " in said and ", port 6817) does not answer" in said, said
        assert "try again in a minute" in said, said
    assert files_of(work) == before and not sweep_dirs(work, "fresh").jobs.exists()  # nothing written
    status = launch("status", str(held), "--workdir", str(work), timeout=60)
    assert status.returncode == 0, status.stderr
    # What accounting knows (a held job reaches it when the controller flushes its records, at its stop or later)
    # or else what the run directory knows; and why
    row = next(line for line in status.stdout.splitlines() if f"{job}_0" in line)
    assert re.search(r"PENDING +│ sacct|NOT_STARTED +│ run dir", row), status.stdout
    assert "note: the Slurm controller (slurmctld on " in status.stdout, status.stdout
    daemon("start", "slurmctld")
    status = launch("status", str(held), "--workdir", str(work))
    assert status.returncode == 0 and "PENDING" in status.stdout and "note:" not in status.stdout, status.stdout
    cancelled = launch("cancel", str(held), "--workdir", str(work))
    assert cancelled.returncode == 0 and f"cancelled {job}" in cancelled.stdout, cancelled.stderr
    queued = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=30).stdout.split()
    assert not [j for j in queued if j.split("_")[0] == job]  # the one job there was, and nothing else submitted


@pytest.mark.slurm_release
@pytest.mark.parametrize("daemon_name", ["slurmdbd", "mariadb"])
def test_while_accounting_is_away_status_says_so_and_resubmit_and_efficiency_refuse(
        tmp_path, tiny_corpus, away, daemon_name):
    work = tmp_path / "work"
    spec = write_spec(tmp_path, tiny_corpus, "counted")
    assert launch(str(spec), "--hold", "--workdir", str(work)).returncode == 0
    job = manifest_of(work, "counted").submissions[0].job_id
    try:
        away(daemon_name)
        status = launch("status", str(spec), "--workdir", str(work), timeout=60)
        assert status.returncode == 0 and "PENDING" in status.stdout, status.stdout + status.stderr
        assert "note: Slurm's accounting (slurmdbd on 10.77.0.1, port 6819, or its database) does not answer" \
            in status.stdout, status.stdout
        for command in (["resubmit", str(spec)], ["status", str(spec), "--efficiency"]):
            out = launch(*command, "--workdir", str(work), timeout=60)
            assert out.returncode == AWAY and "Slurm's accounting (slurmdbd on " in out.stderr, (command, out.stderr)
            assert "Traceback" not in out.stderr
    finally:
        cancel(job)


@pytest.mark.slurm_release
def test_a_task_whose_step_starts_while_the_controller_is_away_waits_for_it_and_trains(tmp_path, tiny_corpus,
                                                                                      away):
    """srun cannot start a step without the controller: the task waits for it (said in its log) and starts the
    step once it is back, instead of failing as if the trainer had."""
    go = tmp_path / "go"
    profile = tmp_path / "waits.yaml"
    profile.write_text((ROOT / "hpc_lab" / "clusters" / "local.yaml").read_text()
                       + f"setup: [\"while [ ! -e '{go}' ]; do sleep 0.2; done\"]\n")
    work = tmp_path / "work"
    spec = write_spec(tmp_path, tiny_corpus, "patient", cluster=str(profile))
    assert launch(str(spec), "--workdir", str(work)).returncode == 0
    manifest = manifest_of(work, "patient")
    job = manifest.task_job_ids()[0]
    try:
        wait_until(lambda: subprocess.run(["squeue", "-h", "-j", job.split("_")[0], "-o", "%T"], capture_output=True,
                                          text=True, timeout=30).stdout.strip() == "RUNNING",
                   timeout=120, poll=0.5, what="the task running its setup")
        away("slurmctld")
        go.touch()
        wait_until(lambda: (log := next(iter((work / "logs" / "patient").glob("*.out")), None)) is not None
                   and "the controller does not answer (scontrol ping); waiting for it" in log.read_text(),
                   timeout=120, poll=0.5, what="the task saying that it waits for the controller")
        daemon("start", "slurmctld")
        assert wait(job) == "COMPLETED"
        log = next(iter((work / "logs" / "patient").glob("*.out")))
        assert "the controller answers again after" in log.read_text()
        records = read_metrics(Path(manifest.runs[0].out_dir))
        assert records[-1].get("event") == "finished" and max(r.get("step", 0) for r in records) == 20
    finally:
        cancel(job)
