"""Sweeps larger than the queue limits let out at once, on the real local cluster: they go out in waves fed by the
sweep's heal job (tinygpt/launch/heal/waves.py), never over the limit, each run once. The limits are set with
sacctmgr on the tests' own QOS `waves` and account `waves` (up.sh --accounts), which no other test uses, and put
back after; the queue is sampled every second, counting the jobs each limit counts."""

from __future__ import annotations

import json
import subprocess
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from tests.support.laptop import laptop_for, on_laptop
from tests.support.processes import launch, wait_until
from tests.support.slurm import daemon, job_fields, manifest_of, unique_name
from tinygpt.launch import api
from tinygpt.launch import manifest as manifest_mod

pytestmark = pytest.mark.slurm

FOREIGN = Path(__file__).resolve().parents[1] / "support" / "foreign"


@contextmanager
def limits(entity: list[str], **values: int):
    """`sacctmgr modify ENTITY set KEY=VALUE...` for the test, cleared (-1) after it."""
    def modify(settings: dict) -> None:
        words = ["sacctmgr", "-i", "modify", *entity, "set", *(f"{k}={v}" for k, v in settings.items())]
        subprocess.run(words, check=True, capture_output=True, timeout=30)

    modify(values)
    try:
        yield modify
    finally:
        modify({key: -1 for key in values})


@contextmanager
def queue_sampled(*selection: str, user: str = "root"):
    """The largest number of `user`'s jobs squeue lists with `selection` (each array task one), sampled every
    second while the block runs: `peak[0]`."""
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.wait(1.0):
            out = subprocess.run(["squeue", "-h", "-r", "-u", user, "-o", "%i", *selection], capture_output=True,
                                 text=True, timeout=30)
            if out.returncode == 0:
                peak[0] = max(peak[0], len(out.stdout.split()))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        stop.set()
        sampler.join()


def write_spec(tmp_path: Path, name: str, runs: int, seconds: int, **resources) -> Path:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump({
        "name": name, "grid": {"i": list(range(runs))},
        "command": {"project": str(FOREIGN), "argv": ["/bin/sh", "-c", f"sleep {seconds}; echo run {{i}}"]},
        "resources": {"time": "00:05:00", **resources}}))
    return spec


def status(spec: Path, work: Path) -> dict:
    """`status --json`'s document, asked in this process (the library's call, the command's code)."""
    return api.open_sweep(spec, work).status().model_dump()


def every_run_once(manifest: manifest_mod.Manifest) -> None:
    """Each run named by exactly one submission of the sweep, and every task of those COMPLETED (sacct)."""
    manifest = manifest_mod.load(manifest.path)
    named = sorted(i for s in manifest.slurm_submissions() for i in s.indices)
    assert named == list(range(len(manifest.runs))), named
    tasks = sorted(manifest.task_job_ids().values())

    def accounted() -> dict[str, str | None]:
        out = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j",
                              ",".join(sorted({t.split("_")[0] for t in tasks}))], capture_output=True, text=True,
                             check=True, timeout=30)
        states = dict(line.split("|")[:2] for line in out.stdout.splitlines() if line)
        return {t: states.get(t) for t in tasks}

    # (accounting hears of an end a moment after the controller, which status asked)
    wait_until(lambda: None not in accounted().values(), timeout=60, poll=1, what="sacct knowing every task")
    assert accounted() == {t: "COMPLETED" for t in tasks}


def status_when(spec: Path, work: Path, condition, what: str, timeout: float = 300) -> dict:
    """The sweep's status document once `condition(document)` holds."""
    def ready() -> dict | None:
        now = status(spec, work)
        return now if condition(now) else None

    return wait_until(ready, timeout=timeout, poll=2, what=what)


def finished(spec: Path, work: Path, what: str) -> dict:
    return status_when(spec, work, lambda s: all(r["state_name"] == "COMPLETED" for r in s["runs"]), what)


@pytest.mark.shares_cluster
def test_a_sweep_over_a_qos_submit_limit_goes_out_in_waves_never_over_it_and_each_run_once(tmp_path, tiny_corpus):
    """QOS waves: MaxSubmitJobsPerUser=5 and, at first, MaxJobsPerUser=0. 16 runs: the launch sends 4 (one place
    is the heal job's; a chain of our trainer would send 3: its data step takes one too); they wait, and status
    says for which limit. Then the submit limit is lowered to 4 (below what is queued) as they are let run: the
    heal job sends the rest in smaller waves, two tasks each (one place is its own, one its next's), never
    failing. The user's jobs in the QOS never exceed 5."""
    name, work = unique_name("waves"), tmp_path / "work"
    spec = write_spec(tmp_path, name, 16, 1, qos="waves")
    with limits(["qos", "waves"], MaxSubmitJobsPerUser=5, MaxJobsPerUser=0) as change, \
            queue_sampled("-q", "waves") as peak:
        chained = tmp_path / "chained.yaml"  # (our trainer's chain has a data step, which takes a place too)
        chained.write_text(yaml.safe_dump({"name": unique_name("wchain"), "train": {"data_file": str(tiny_corpus)},
                                           "grid": {"lr": [i / 1000 for i in range(1, 17)]},
                                           "resources": {"time": "00:05:00", "qos": "waves"}}))
        dry = launch("check", str(chained), "--chain", "--workdir", str(work))
        assert dry.returncode == 0 and "waves: 16 task(s) wait for a wave; 3 fit now" in dry.stdout, dry.stdout
        out = launch(str(spec), "--workdir", str(work))
        assert out.returncode == 0, out.stdout + out.stderr
        assert "waves: 16 task(s) wait for a wave; 4 fit now (QOS waves MaxSubmitPU=5 counts your jobs" in out.stdout
        assert "submitted 4 run(s) as job array" in out.stdout and "12 wait for a wave" in out.stdout
        held = status_when(spec, work, lambda s: any("QOSMaxJobsPerUserLimit" in line for line in s["queue"]),
                           "status naming the limit the first wave waits for", timeout=60)
        assert held["counts"]["WAITING"] == 12 and held["queue"][0].startswith("waves: 12 run(s) wait for a wave; "
                                                                               "heal job"), held["queue"]
        # (held, nothing runs: the first wave's 4 tasks and the heal job fill the 5 places, whatever the sampler saw)
        queued = subprocess.run(["squeue", "-h", "-r", "-u", "root", "-q", "waves", "-o", "%i"], capture_output=True,
                                text=True, check=True, timeout=30).stdout.split()
        assert len(queued) == 5, queued
        change({"MaxJobsPerUser": -1, "MaxSubmitJobsPerUser": 4})
        done = finished(spec, work, "every run of the sweep COMPLETED")
    assert done["queue"][0].startswith("waves: every run went out"), done["queue"]
    assert peak[0] <= 5, peak[0]
    manifest = manifest_of(work, name)
    waves = [len(s.indices) for s in manifest.submissions if s.indices]
    assert waves[0] == 4 and max(waves[1:]) <= 2, waves  # (after the limit was lowered: 4 - 2 places a wave)
    every_run_once(manifest)


@pytest.mark.shares_cluster
def test_an_association_limit_with_a_relaunch_while_fed_then_a_cancel_that_stops_the_feeding(tmp_path, tiny_corpus):
    """Account waves: MaxSubmitJobs=3 on the user's association. 4 runs go out in waves; the spec launched again
    with 3 more points while they are fed adds them to the waves: each of the 7 runs once. Then a chain of our
    trainer, held (its data step takes a place, its first wave of one waits for it), cancelled after its first
    wave: nothing more is sent, its runs wait still."""
    name, work = unique_name("wassoc"), tmp_path / "work"
    spec = write_spec(tmp_path, name, 4, 1, account="waves")
    with limits(["user", "root", "where", "account=waves"], MaxSubmitJobs=3), queue_sampled("-A", "waves") as peak:
        assert launch(str(spec), "--workdir", str(work)).returncode == 0
        spec = write_spec(tmp_path, name, 7, 1, account="waves")
        again = launch(str(spec), "--workdir", str(work))
        assert again.returncode == 0, again.stdout + again.stderr
        finished(spec, work, "every run, old and new, COMPLETED")
        every_run_once(manifest_of(work, name))

        held = unique_name("wcancel")  # (our trainer's chain, held: its data step, then a first wave of 1 after it)
        spec = tmp_path / f"{held}.yaml"
        spec.write_text(yaml.safe_dump({"name": held, "train": {"data_file": str(tiny_corpus)},
                                        "grid": {"lr": [0.001, 0.002, 0.003, 0.004]},
                                        "resources": {"time": "00:05:00", "account": "waves"}}))
        out = launch(str(spec), "--chain", "--hold", "--workdir", str(work))
        assert out.returncode == 0 and "submitted 1 run(s)" in out.stdout, out.stdout + out.stderr
        manifest = manifest_of(work, held)
        data, first = (s.job_id for s in manifest.submissions[:2])
        assert [s.role for s in manifest.submissions] == ["data", None, "heal"]
        assert job_fields(f"{first}_0")["Dependency"].startswith(f"afterok:{data}")
        assert launch("cancel", str(spec), "--workdir", str(work)).returncode == 0
        wait_until(lambda: not subprocess.run(["squeue", "-h", "-A", "waves", "-u", "root"], capture_output=True,
                                              text=True, timeout=30).stdout.strip(), timeout=120, poll=1,
                   what="the cancelled sweep's jobs gone from the queue")
        after = status(spec, work)
    assert peak[0] <= 3, peak[0]
    assert len(manifest_mod.load(manifest.path).submissions) == len(manifest.submissions)  # (nothing sent after)
    assert after["counts"]["WAITING"] == len(manifest.waiting()) >= 1, after["counts"]  # (as the launch left them)
    assert "cancelled: nothing more is sent" in after["queue"][0], after["queue"]


@pytest.mark.slurm  # (not shares_cluster: it stops the controller, which every other test's jobs need)
def test_the_controller_away_between_waves_loses_no_run_and_sends_none_twice(tmp_path):
    """QOS waves: MaxSubmitJobsPerUser=4. 5 runs: the launch sends 3 (one place is the heal job's). The heal job
    finds the sweep locked (as a command by hand holds it), then Slurm's controller stopped: it waits and asks
    again, deciding nothing from no answer. Once the controller is back it sends the other two: each run once."""
    name, work = unique_name("waway"), tmp_path / "work"
    spec = write_spec(tmp_path, name, 5, 2, qos="waves")
    heal_log = lambda: "\n".join(p.read_text() for p in (work / "logs" / name).glob("heal-*.out"))  # noqa: E731
    stopped = False
    with limits(["qos", "waves"], MaxSubmitJobsPerUser=4):
        try:
            out = launch(str(spec), "--workdir", str(work))
            assert out.returncode == 0 and "submitted 3 run(s)" in out.stdout, out.stdout + out.stderr
            with manifest_mod.sweep_lock(work / "jobs" / name):  # (taken before the first task's 2 s are over)
                wait_until(lambda: "is being changed by another" in heal_log(), timeout=120, poll=0.5,
                           what=lambda: f"the heal job waiting for the lock\n{heal_log()}")
                daemon("stop", "slurmctld")
                stopped = True
            # (the first question of a wave is how many jobs the limit counts now: squeue, the controller's)
            wait_until(lambda: heal_log().rpartition("then asking again: ")[2].startswith("squeue did not answer"),
                       timeout=120, poll=0.5, what=lambda: f"the heal job waiting for the controller\n{heal_log()}")
            assert len(manifest_mod.load(manifest_of(work, name).path).submissions) == 2  # (3 runs, 1 heal job)
            daemon("start", "slurmctld")
            stopped = False
            finished(spec, work, "every run of the sweep COMPLETED")
        finally:
            if stopped:
                daemon("start", "slurmctld")
            subprocess.run(["scancel", "-n", name], capture_output=True, timeout=30)  # (a failure leaves none queued)
    every_run_once(manifest_of(work, name))


@pytest.mark.slurm(needs=["login"])
@pytest.mark.shares_cluster
def test_a_sweep_launched_from_a_laptop_goes_out_in_waves_on_the_cluster(tmp_path):
    """From a laptop, over SSH, as the login node's user tgcsh, whose association in account waves gets
    MaxSubmitJobs=3 (no other test's jobs count against it): the chain's launch there sends what fits, the heal
    job the rest and then the chain's report, and the laptop's `status` follows it to the end; each run once,
    tgcsh's jobs never over 3."""
    laptop = laptop_for("tgcsh", tmp_path, remote_dir="tinygpt-hpc-waves")
    name = unique_name("wlaptop")
    spec = write_spec(tmp_path, name, 5, 1, account="waves")
    where = ["--workdir", str(tmp_path)]

    def ended() -> dict | None:
        said = on_laptop(laptop, "status", str(spec), "--json", *where, cwd=tmp_path)
        document = json.loads(said.stdout) if said.returncode == 0 else {"runs": []}
        return document if document["runs"] and all(r["state_name"] == "COMPLETED" for r in document["runs"]) \
            else None

    with limits(["user", "tgcsh", "where", "account=waves"], MaxSubmitJobs=3), \
            queue_sampled("-A", "waves", user="tgcsh") as peak:
        out = on_laptop(laptop, str(spec), "--chain", "--cluster", str(laptop["profile"]), *where, cwd=tmp_path)
        assert out.returncode == 0 and "submitted 2 run(s)" in out.stdout, out.stdout + out.stderr
        assert "3 wait for a wave" in out.stdout and "the report goes out after the last wave" in out.stdout, \
            out.stdout
        said = on_laptop(laptop, "status", str(spec), *where, cwd=tmp_path).stdout
        assert "-> report after the last wave" in said, said
        done = wait_until(ended, timeout=300, poll=2, what="the laptop's status: every run COMPLETED")
        report = laptop["there"] / "runs" / name / "report.md"  # (the chain's last step, after the last wave)
        wait_until(report.exists, timeout=120, poll=1, what="the chain's report")
    assert done["queue"][0].startswith("waves: every run went out"), done["queue"]
    assert peak[0] <= 3, peak[0]  # (the report job among them)
    every_run_once(manifest_mod.load(laptop["there"] / "jobs" / name / "manifest.json"))
