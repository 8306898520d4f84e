"""A sweep's retry policy carried out by Slurm, on the real local cluster: its heal job reads how each run
ended, sends again what the policy allows with what it needs, and sends one summary at the end.

tests/support/foreign/ends.py ends as each run's `kind` says: a time limit it does not survive, memory over its
request (the local cluster enforces --mem with OverMemoryKill, polling every second at --acctg-freq 1), a silent
heartbeat, a bug of its own; each later life ends well. Nothing waits on the machine's speed: every wait is for
an event (a job's end, a log line, a file), with a timeout that fails loudly.
"""

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.cluster_gate import LOCAL_CLUSTER_HOME
from tests.support.paths import ROOT
from tests.support.processes import launch, wait_until
from tests.support.slurm import (
    cancel,
    daemon,
    in_service,
    manifest_of,
    node,
    python,
    sbatch,
    signal_steps,
    squeue_nodes,
    unique_name,
    wait,
)
from tests.support.tiny import tiny_train
from tinygpt.launch import manifest as manifest_mod

pytestmark = pytest.mark.slurm

FOREIGN = ROOT / "tests" / "support" / "foreign"
MAIL = LOCAL_CLUSTER_HOME / "mail"
ADDRESS = "tester@example.org"


def launch_ends(tmp_path: Path, kinds: list[str], retry: dict, **resources) -> tuple[Path, Path, str]:
    """Launch a sweep of ends.py, a run per kind, under `retry`: (its spec, its workdir, its name)."""
    return launch_spec(tmp_path, {
        "grid": {"kind": kinds}, "retry": retry,
        "command": {"project": str(FOREIGN), "argv": [python(), "ends.py", "{kind}", "{run_dir}"], "heartbeat_s": 4},
        # (5 minutes: Slurm's own warning, 120 s before the limit, comes after every test is done; a test that
        # means a run to meet its time limit sends the warning itself, as Slurm does)
        "resources": {"time": 5, "mem": "300M", "sbatch_options": {"acctg-freq": 1}, **resources}})


def launch_spec(tmp_path: Path, keys: dict) -> tuple[Path, Path, str]:
    name = unique_name("heal")
    spec, work = tmp_path / f"{name}.yaml", tmp_path / "work"
    spec.write_text(yaml.safe_dump({"name": name, **keys}))
    out = launch(str(spec), "--workdir", str(work))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "retry: heal job" in out.stdout, out.stdout
    return spec, work, name


def every_job(manifest: manifest_mod.Manifest) -> list[str]:
    return sorted({s.job_id for s in manifest.slurm_submissions()})


def sent(manifest: manifest_mod.Manifest, run: str) -> list[manifest_mod.Submission]:
    """The submissions that sent run `run` (by name)."""
    index = manifest.find(run)[0].index
    return [s for s in manifest.submissions if index in s.indices]


def logs(work: Path) -> str:
    """Every log of the work directory's sweeps, then how Slurm's accounting saw each of their jobs."""
    said = [f"== {p}\n{p.read_text(errors='replace')}" for p in sorted((work / "logs").rglob("*.out"))]
    jobs = [j for m in sorted((work / "jobs").glob("*/manifest.json")) for j in every_job(manifest_mod.load(m))]
    if not jobs:
        return "\n".join(said)
    sacct = subprocess.run(["sacct", "-n", "-P", "-o", "JobID,JobName,State,ExitCode,NodeList,Start,End", "-j",
                            ",".join(jobs)], capture_output=True, text=True, timeout=30)
    return "\n".join([*said, "== sacct", sacct.stdout + sacct.stderr])


def mails_of(job_id: str) -> list[str]:
    """What the cluster's mail program was given for job `job_id` (up.sh's mail-record.sh)."""
    texts = [p.read_text() for p in MAIL.glob("*.txt")] if MAIL.is_dir() else []
    return [t for t in texts if f"SLURM_JOB_ID={job_id}\n" in t]


@pytest.mark.shares_cluster
def test_a_sweep_with_every_kind_of_end_finishes_what_can_be_retried_and_sends_one_summary(tmp_path):
    """Four runs, one of each end: a time limit it cannot save for (the signal Slurm sends before the limit ends it;
    sent again with twice the time), out of memory (twice the memory), a hung heartbeat (again, elsewhere) and a
    bug (given up, its error line kept). The heal job's second pass finds everything ended, writes the summary,
    mails it through Slurm and runs the user's command with it: two rounds, each run sent at most twice.

    The warning is sent as Slurm sends it (`scancel -s USR2` to the job's steps) once the program runs: slurmctld
    itself sends it at its next look at the time limits, up to 30 s later."""
    delivered = tmp_path / "delivered.md"
    keep = [python(), "-c", "import sys; open(sys.argv[1], 'w').write(sys.stdin.read() + sys.argv[2])",
            str(delivered), "{headline}"]
    spec, work, name = launch_ends(tmp_path, ["bug", "time", "oom", "hang"],
                                   {"rounds": 2, "notify": {"mail": ADDRESS, "command": keep}})
    summary = work / "runs" / name / "summary.md"
    manifest = manifest_of(work, name)
    try:
        timed = manifest.find("kind-time")[0]
        wait_until(lambda: (Path(timed.out_dir) / "lives").exists(), timeout=120, poll=0.2, what="the program running")
        signal_steps(manifest.task_job_ids()[timed.index])
        wait_until(lambda: delivered.exists(), timeout=420, poll=1,
                   what=lambda: f"the summary delivered\n{logs(work)}")
        manifest = manifest_of(work, name)
        notify = [s.job_id for s in manifest.submissions if s.role == "notify"]
        mail = wait_until(lambda: mails_of(notify[0]), timeout=60, poll=0.5, what="Slurm's mail of the summary's job")
    finally:
        cancel(*every_job(manifest_of(work, name)))
    text = summary.read_text()
    assert text.splitlines()[0] == f"# sweep {name}: 3 of 4 run(s) finished, 3 after a retry, 1 given up; 2 round(s)"
    assert delivered.read_text() == text + text.splitlines()[0].removeprefix("# ")
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in text.splitlines() if line.startswith("| kind-")}
    assert rows["kind-time"] == "| kind-time | 2 | time_limit, finished | as launched; --time=00:10:00 | finished |"
    assert rows["kind-oom"] == "| kind-oom | 2 | out_of_memory, finished | as launched; --mem=600M | finished |"
    assert rows["kind-hang"].startswith("| kind-hang | 2 | hung, finished | as launched; --exclude=node"), text
    assert rows["kind-bug"].startswith("| kind-bug | 1 | program | as launched | given up: a failure of the program "
                                       "itself"), text
    assert "ValueError: bad data: row 7 has no label" in text
    # What each round asked for, and that no run went twice in a round.
    assert [s.changes for s in sent(manifest, "kind-time")] == [None, {"time": "00:10:00"}]
    assert [s.changes for s in sent(manifest, "kind-oom")] == [None, {"mem": "600M"}]
    hang = sent(manifest, "kind-hang")  # (again, but not where it hung)
    assert (hang[1].round, hang[1].changes) == (2, {"exclude": hang[1].previous["3"].nodes}), hang
    assert len(sent(manifest, "kind-bug")) == 1
    assert [s.round for s in manifest.submissions if s.role == "heal"] == [1, 2]
    assert len(notify) == 1 and "COMPLETED" in mail[0], mail
    assert len(mail) == 1 and f"argv: -s Slurm Job_id={notify[0]} Name=sweep {name}: 3 of 4" in mail[0], mail
    assert mail[0].rstrip().endswith(ADDRESS) or f" {ADDRESS}\n" in mail[0], mail
    status = launch("status", str(spec), "--workdir", str(work))
    assert f"retry: done: sweep {name}: 3 of 4 run(s) finished" in status.stdout, status.stdout


@pytest.mark.slurm_release
@pytest.mark.shares_cluster
def test_out_of_memory_is_told_from_a_bug_on_this_release_and_the_summary_mailed(tmp_path):
    """Slurm's OverMemoryKill ends the job FAILED or OUT_OF_MEMORY, by release; either way the policy reads it
    as out of memory (its log says so), the next round asks for twice the memory and finishes, and this release's
    slurmctld mails the summary's job."""
    spec, work, name = launch_ends(tmp_path, ["oom"], {"rounds": 1, "notify": {"mail": ADDRESS}})
    summary = work / "runs" / name / "summary.md"
    try:
        wait_until(summary.exists, timeout=240, poll=1, what=lambda: f"the summary\n{logs(work)}")
        # (the heal job writes the summary, then submits the job that mails it and records that job)
        notify = wait_until(lambda: next((s.job_id for s in manifest_of(work, name).submissions
                                          if s.role == "notify"), None), timeout=60, poll=0.5,
                            what="the summary's mail job in the manifest")
        mail = wait_until(lambda: mails_of(notify), timeout=60, poll=0.5, what="Slurm's mail of the summary's job")
    finally:
        cancel(*every_job(manifest_of(work, name)))
    assert "| kind-oom | 2 | out_of_memory, finished | as launched; --mem=600M | finished |" in summary.read_text(), \
        summary.read_text()
    first = sent(manifest_of(work, name), "kind-oom")[1].previous["0"]
    assert first.end == "out_of_memory" and first.state in ("FAILED", "OUT_OF_MEMORY"), first
    assert f"Name=sweep {name}: 1 of 1 run(s) finished" in mail[0] and "COMPLETED" in mail[0], mail
    assert ADDRESS in mail[0], mail


@pytest.mark.shares_cluster
def test_our_trainer_out_of_its_memory_is_sent_again_with_more_and_finishes(tmp_path, tiny_corpus):
    """The trainer, asked for less memory than torch alone takes, is killed for it; the next round asks for four
    times as much and trains to its end."""
    spec, work, name = launch_spec(tmp_path, {
        "train": tiny_train(data_file=str(tiny_corpus), data_dir=str(tmp_path / "data"), max_steps=4),
        "resources": {"time": 5, "mem": "150M", "sbatch_options": {"acctg-freq": 1}},
        "retry": {"rounds": 1, "mem_factor": 6, "mem_from_peak": 1.5}})
    summary = work / "runs" / name / "summary.md"
    try:
        wait_until(summary.exists, timeout=300, poll=1, what=lambda: f"the summary\n{logs(work)}")
    finally:
        cancel(*every_job(manifest_of(work, name)))
    assert "| base | 2 | out_of_memory, finished | as launched; --mem=900M | finished |" in summary.read_text(), \
        summary.read_text()
    assert [s.changes for s in sent(manifest_of(work, name), "base")] == [None, {"mem": "900M"}]
    # What a right-sizing policy would ask for next: the finished run's measured peak x 1.5.
    def efficiency() -> dict[str, str] | None:  # (accounting records the job's peak a moment after its end)
        shown = launch("status", str(spec), "--workdir", str(work), "--efficiency").stdout
        header, row = (next(line for line in shown.splitlines() if word in line) for word in ("retry asks", "base"))
        cells = dict(zip((c.strip() for c in header.split("┃")[1:-1]), (c.strip() for c in row.split("│")[1:-1])))
        return None if cells["mem peak / asked"].startswith("-") else cells

    cells = wait_until(efficiency, timeout=60, poll=1, what="sacct's peak memory of the finished run")
    peak = float(cells["mem peak / asked"].split(" MB")[0].replace(",", ""))
    asks = float(cells["retry asks"].removesuffix(" MB").replace(",", ""))
    assert abs(asks - peak * 1.5) <= 1.5, cells  # (the peak is shown to the megabyte)


def test_runs_lost_to_a_node_and_to_a_preemption_go_again_through_a_controller_away_each_once(tmp_path):
    """Two runs on partition low-cancel, a node each. One loses its node (made not requeueable first, so that
    Slurm ends it NODE_FAIL and leaves it to the policy); a job of partition high takes the other's node
    (PreemptMode=CANCEL: PREEMPTED). The heal job then finds the sweep locked (as a `resubmit` by hand holds
    it), then Slurm's controller stopped: it waits and asks again, deciding nothing from no answer. Once the
    controller is back it sends each run once more, the first without the lost node, and both finish."""
    spec, work, name = launch_ends(tmp_path, ["stay", "time"], {"rounds": 1}, time=10, partition="low-cancel",
                                   cpus_per_task=2)
    manifest = manifest_of(work, name)
    lost, preempted = manifest.task_job_ids()[0], manifest.task_job_ids()[1]
    where = wait_until(lambda: (squeue_nodes(lost), squeue_nodes(preempted)) if all(
        (squeue_nodes(lost), squeue_nodes(preempted))) else None, timeout=120, poll=0.5, what="both runs running")
    heal_log = lambda: "\n".join(p.read_text() for p in (work / "logs" / name).glob("heal-*.out"))  # noqa: E731
    waited = lambda words: heal_log().rpartition("then asking again: ")[2].startswith(words)  # noqa: E731
    blocker, stopped, crashed = None, False, False
    try:
        with manifest_mod.sweep_lock(work / "jobs" / name):
            subprocess.run(["scontrol", "update", f"jobid={lost}", "requeue=0"], check=True, timeout=30)
            node("crash", where[0])
            crashed = True
            # (as a site's node health check would say at once what slurmctld finds only after SlurmdTimeout)
            subprocess.run(["scontrol", "update", f"nodename={where[0]}", "state=down", "reason=crashed"], check=True,
                           timeout=30)
            blocker = sbatch("-p", "high", "-w", where[1], "-c", "2", "-J", unique_name("high"), "-o", "/dev/null",
                             "--wrap", "sleep 1")
            assert (wait(lost, timeout=120), wait(preempted, timeout=120)) == ("NODE_FAIL", "PREEMPTED")
            node("boot", where[0])  # (its run goes elsewhere: the node may come back meanwhile)
            crashed = False
            wait_until(lambda: "is being changed by another" in heal_log(), timeout=180, poll=0.5,
                       what=lambda: f"the heal job waiting for the lock\n{logs(work)}")
            daemon("stop", "slurmctld")
            stopped = True
        wait_until(lambda: waited("the Slurm controller"), timeout=120, poll=0.5,
                   what=lambda: f"the heal job waiting for the controller\n{heal_log()}")
        daemon("start", "slurmctld")
        stopped = False
        summary = work / "runs" / name / "summary.md"
        wait_until(summary.exists, timeout=240, poll=1, what=lambda: f"the summary\n{logs(work)}")
    finally:
        if stopped:
            daemon("start", "slurmctld")
        if crashed:
            node("boot", where[0])
        cancel(*every_job(manifest_of(work, name)), *([blocker] if blocker else []))
        wait_until(lambda: in_service(where[0]), timeout=120, poll=0.5, what=f"{where[0]} back in service")
    text = summary.read_text()
    assert f"| kind-stay | 2 | node_failure, finished | as launched; --exclude={where[0]} | finished |" in text, text
    assert "| kind-time | 2 | preempted, finished | as launched; as before | finished |" in text, text
    manifest = manifest_of(work, name)
    assert [s.changes for s in sent(manifest, "kind-stay")] == [None, {"exclude": where[0]}]
    assert [s.changes for s in sent(manifest, "kind-time")] == [None, {}]
    assert [s.round for s in manifest.submissions if s.role == "heal"] == [1, 2]
    training = [s.job_id for s in manifest.submissions if s.indices]
    sacct = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID", "-j", ",".join(training)],
                           capture_output=True, text=True, timeout=30).stdout.split()
    assert len(sacct) == 4, sacct  # (both runs in round 1, both in round 2: no more)


@pytest.mark.shares_cluster
def test_status_shows_the_round_and_the_heal_job_and_cancel_ends_both(tmp_path):
    """While its run is live, `status` names the round, the heal job waiting on it and the column of
    rounds; `cancel` cancels the heal job with the runs, and nothing is sent after."""
    spec, work, name = launch_ends(tmp_path, ["stay"], {"rounds": 2})
    manifest = manifest_of(work, name)
    heal = next(s.job_id for s in manifest.submissions if s.role == "heal")
    wait_until(lambda: squeue_nodes(manifest.task_job_ids()[0]), timeout=120, poll=0.5, what="the run running")
    status = launch("status", str(spec), "--workdir", str(work))
    assert f"retry: round 1 of at most 3; heal job {heal} PENDING (Dependency)" in status.stdout, status.stdout
    header = next(line for line in status.stdout.splitlines() if "round" in line and "state" in line)
    row = next(line for line in status.stdout.splitlines() if "kind-stay" in line)
    cells = dict(zip((c.strip() for c in header.split("┃")[1:-1]), (c.strip() for c in row.split("│")[1:-1])))
    assert cells["round"] == "1", status.stdout
    done = launch("cancel", str(spec), "--workdir", str(work))
    assert done.returncode == 0 and heal in done.stdout, done.stdout + done.stderr
    assert wait(heal) == "CANCELLED" and wait(manifest.task_job_ids()[0]) == "CANCELLED"
    after = manifest_of(work, name)
    assert len(after.submissions) == len(manifest.submissions) and (work / "jobs" / name / "cancelled").exists()
    assert "cancelled: nothing more is sent" in launch("status", str(spec), "--workdir", str(work)).stdout
