"""A retry policy's decisions, without a cluster: how each kind of end is read from Slurm's state and the run's
log, what the next round asks for, when a run is given up, and the summary. (tests/cluster/test_retry.py makes
each end for real and lets the heal job act on it.)"""

import contextlib
import io
import signal
from pathlib import Path

import pytest
import yaml

from tinygpt.launch import manifest as manifest_mod
from tinygpt.launch.commands import cli
from tinygpt.launch.errors import LaunchError
from tinygpt.launch.heal import decide
from tinygpt.launch.node import supervise
from tinygpt.launch.read.efficiency import Usage
from tinygpt.launch.read.run_states import Row
from tinygpt.launch.spec import sweep as spec_mod
from tinygpt.launch.spec.retry import RetryPolicy

# (kind of the run, Slurm's state, what its log says, nodes): one run each.
ENDS = {
    "ok": ("COMPLETED", "ends.py: done", "node1"),
    "bug": ("FAILED", "Traceback (most recent call last):\nValueError: bad data: row 7 has no label\n"
                      "srun: error: node1: task 0: Exited with exit code 1", "node1"),
    "oom": ("FAILED", "slurmstepd-node2: error: StepId=23.0 exceeded memory limit (464441344 > 314572800), being "
                      "killed\nslurmstepd-node2: error: Exceeded job memory limit", "node2"),
    "oom_state": ("OUT_OF_MEMORY", "", "node2"),
    "time": ("TIMEOUT", "slurmstepd: error: *** JOB 18 ON node2 CANCELLED AT 2026-12-05T00:00:00 DUE TO TIME LIMIT ***",
             "node2"),
    "unsaved": ("FAILED", f"tinygpt: run kind=x {supervise.UNSAVED} (SIGUSR2)", "node1"),
    # What a program prints is no evidence: Slurm's processes' and the heal job's lines are.
    "says_oom": ("FAILED", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
                           f"slurmstepd: error: x\nsays: tinygpt: run kind=x {supervise.UNSAVED} (SIGUSR2)", "node1"),
    # Task 0's own failure, after which srun ended task 1 (SIGTERM) or the warning signal reached it first.
    "peer": ("FAILED", f"ValueError: bad shape\n"
                       f"tinygpt: run kind=x {supervise.FAILED} 1\n"
                       f"tinygpt: run kind=x {supervise.STOPPED} (SIGTERM)\n"
                       f"tinygpt: run kind=x {supervise.UNSAVED} (SIGUSR2)",
             "node1"),
    "node": ("NODE_FAIL", "", "node2"),
    "preempted": ("PREEMPTED", "", "node1"),
    "cancelled": ("CANCELLED by 0", "", "node1"),
    # A scancel of a program that cleans up, then dies of the SIGTERM (or of the warning the scancel sent).
    "scancelled": ("CANCELLED by 0", f"tinygpt: run kind=x {supervise.STOPPED} (SIGTERM)\n"
                                     f"tinygpt: run kind=x {supervise.UNSAVED} (SIGUSR2)\nslurmstepd: error: Exceeded "
                                     f"job memory limit", "node1"),
    "running": ("RUNNING", "", "node1"),
}


@pytest.fixture
def sweep(tmp_path):
    """A command sweep with a retry policy, written by a dry run, one run per kind of end, each with a log as its
    job's array task left it (job 100)."""
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "s", "grid": {"kind": list(ENDS)}, "command": {"argv": ["python", "x.py", "{kind}"]},
        "resources": {"time": 10, "mem": "300M"},
        "retry": {"rounds": 2, "max_time": 30, "max_mem": "1G", "mem_from_peak": 1.5}}))
    (tmp_path / "x.py").write_text("")
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main([str(spec), "--workdir", str(tmp_path / "w"), "--dry-run", "--no-snapshot"]) == 0
    path = tmp_path / "w" / "jobs" / "s" / "manifest.json"
    manifest_mod.record_submission(path, "sbatch", "100", list(range(len(ENDS))), array=f"0-{len(ENDS) - 1}",
                                   script="s.sbatch")
    manifest = manifest_mod.load(path)
    for index, (_, log, _) in enumerate(ENDS.values()):
        (Path(manifest.logs_dir) / f"100_{index}.out").write_text(f"tinygpt: run {index} (command), job 100_{index}\n"
                                                                  f"{log}\n")
    return manifest


def rows(manifest) -> list[Row]:
    return [Row(i, f"kind={kind}", f"100_{i}", state, "sacct", 0, None, None, None, None, None, None, f"/runs/{kind}",
                nodes) for i, (kind, (state, _, nodes)) in enumerate(ENDS.items())]


def decisions(manifest, usage=None) -> dict[str, decide.Decision]:
    policy = RetryPolicy.of(manifest.retry)
    return {d.row.name.removeprefix("kind="): d for d in decide.decide(manifest, rows(manifest), usage or {},
                                                                           policy)}


def test_each_end_is_read_from_slurms_state_and_the_runs_log(sweep):
    found = {kind: (d.end.kind, d.action) for kind, d in decisions(sweep).items()}
    assert found == {"ok": ("finished", "done"), "bug": ("program", "give up"), "oom": ("out_of_memory", "send"),
                     "oom_state": ("out_of_memory", "send"), "time": ("time_limit", "send"),
                     "unsaved": ("time_limit", "send"), "says_oom": ("program", "give up"),
                     "peer": ("program", "give up"), "node": ("node_failure", "send"),
                     "preempted": ("preempted", "send"), "cancelled": ("cancelled", "give up"),
                     "scancelled": ("cancelled", "give up"), "running": ("live", "wait")}


def test_the_next_round_asks_for_what_each_end_needs(sweep):
    found = decisions(sweep)
    assert found["time"].options == {"time": "00:20:00"} == found["unsaved"].options
    assert found["oom"].options == {"mem": "600M"} == found["oom_state"].options
    assert found["node"].options == {"exclude": "node2"}
    assert found["preempted"].options == {}
    assert found["bug"].why == "a failure of the program itself" and "ValueError: bad data" in found["bug"].end.line
    assert found["cancelled"].why == "cancelled by a person"


def test_growth_stops_at_the_policys_caps_and_rounds(sweep):
    """A run at max_time or max_mem is given up; one whose newest job began the last round too (a resubmission
    by hand leaves a run in its round)."""
    path = sweep.path
    time_run, oom_run, node_run = (list(ENDS).index(k) for k in ("time", "oom", "node"))
    manifest_mod.record_submission(path, "sbatch", "200", [time_run], array=str(time_run), script="s.sbatch",
                                   changes={"time": "00:30:00"}, round=2)
    manifest_mod.record_submission(path, "sbatch", "201", [oom_run], array=str(oom_run), script="s.sbatch",
                                   changes={"mem": "1024M"}, round=2)
    manifest_mod.record_submission(path, "sbatch", "202", [node_run], array=str(node_run), script="s.sbatch",
                                   changes={"exclude": "node2"}, round=3)
    manifest_mod.record_submission(path, "sbatch", "203", [node_run], array=str(node_run), script="s.sbatch",
                                   changes={"exclude": "node2"})  # (a `resubmit` by hand: the run stays in round 3)
    logs = Path(sweep.logs_dir)
    for job, index in (("200", time_run), ("201", oom_run), ("203", node_run)):  # (each ended as before)
        (logs / f"100_{index}.out").rename(logs / f"{job}_{index}.out")
    found = decisions(manifest_mod.load(path))
    assert found["time"].why == "it met its time limit at the most allowed, 00:30:00"
    assert found["oom"].why == "it ran out of memory at the most allowed, 1024 MB"
    assert (found["node"].action, found["node"].why) == ("give up", "its 2 retry round(s) are spent")
    assert found["preempted"].action == "send"


def test_a_run_sent_again_asks_for_its_measured_peak_times_the_margin(sweep):
    usage = {"100_4": Usage("100_4", "TIMEOUT", 60, 1, 60.0, 300.0, peak_mem_mb=100.0),
             "100_2": Usage("100_2", "FAILED", 5, 1, 5.0, 300.0, peak_mem_mb=300.0)}
    found = decisions(sweep, usage)
    assert found["time"].options == {"time": "00:20:00", "mem": "150M"}  # (right-sized down: 100 MB x 1.5)
    assert found["oom"].options == {"mem": "600M"}  # (out of memory: grown, never right-sized below its need)


def test_the_summary_names_every_run_and_each_given_up_ones_error_line(sweep):
    time_run = list(ENDS).index("time")
    manifest_mod.record_submission(sweep.path, "sbatch", "150", [time_run], array=str(time_run), script="s.sbatch",
                                   changes={"exclude": "node2"}, round=2, previous={str(time_run): manifest_mod.Life(
                                       job_id="100_4", state="NODE_FAIL", nodes="node2", end="node_failure")})
    logs = Path(sweep.logs_dir)
    (logs / f"100_{time_run}.out").rename(logs / f"150_{time_run}.out")
    manifest = manifest_mod.load(sweep.path)
    text = decide.summary(manifest, list(decisions(manifest).values()))
    assert text.splitlines()[0] == "# sweep s: 1 of 13 run(s) finished, 1 after a retry, 5 given up; 2 round(s)"
    assert "| kind=time | 2 | node_failure, time_limit | as launched; --exclude=node2 | time_limit |" in text, text
    assert "- kind=bug (100_1 FAILED, program): ValueError: bad data: row 7 has no label" in text


def test_the_heal_job_says_how_its_program_ended_as_the_classifier_reads_it(sweep, capsys):
    """Died of the stop signal passed on to it: unsaved (a time limit). Died of a SIGTERM: stopped (a scancel, a
    preemption, srun ending a step whose other task failed), never a time limit. Its own status: its failure."""
    head = sweep  # (its command's stop signal is the profile's)
    stop = getattr(signal, f"SIG{head.command.stop_signal}")
    for ended, said in [((128 + stop, [stop]), f"run r {supervise.UNSAVED} ({stop.name})"),
                        ((128 + signal.SIGTERM, [signal.SIGTERM, stop]), f"run r {supervise.STOPPED} (SIGTERM)"),
                        ((1, [stop]), f"run r {supervise.FAILED} 1"), ((0, []), None)]:
        assert supervise.after(supervise.Ended(*ended), head, "r") == ended[0]
        err = capsys.readouterr().err
        assert (said in err) if said else err == "", (ended, err)


def test_a_profiles_policy_is_every_sweeps_and_a_spec_changes_or_ends_it(tmp_path):
    profile = tmp_path / "p.yaml"
    profile.write_text("name: p\npartitions: {short: {max_time: '01:00:00'}}\nnode: {mem: 8G}\n"
                       "retry: {rounds: 4, mem_factor: 3}\n")
    spec = tmp_path / "s.yaml"
    for retry, expected in [(None, (4, 3.0, 60, 8192)), ({"rounds": 1}, (1, 3.0, 60, 8192)), ({"rounds": 0}, None)]:
        spec.write_text(yaml.safe_dump({"name": "s", "cluster": str(profile), "resources": {"time": 10},
                                        **({"retry": retry} if retry else {})}))
        policy = spec_mod.load(spec, tmp_path).retry
        assert (policy and (policy.rounds, policy.mem_factor, policy.max_time, policy.max_mem)) == expected


def test_a_policy_refuses_what_it_cannot_do(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "s", "backend": "submitit", "resources": {"time": 30},
                                    "retry": {"max_time": 20, "ends": ["hung"]}}))
    with pytest.raises(LaunchError) as err:
        spec_mod.load(spec, tmp_path)
    assert err.value.problems == [
        "retry.max_time: 00:20:00 is less than resources.time 00:30:00; a retry never asks for less",
        "retry: a sweep's heal job resubmits with the sbatch backend; remove `backend: submitit` or `retry`"]


def test_a_policy_below_what_a_run_asks_is_refused_and_names_where_it_came_from(tmp_path):
    """Each cap below the spec's own request, from the spec and from the profile: the profile's is named, with
    how one spec sets it or turns the profile's policy off."""
    profile = tmp_path / "p.yaml"
    profile.write_text("name: p\nnode: {mem: 8G}\nretry: {max_time: 5, max_mem: 100M}\n")
    spec = tmp_path / "s.yaml"
    for own, said in [({}, " (from profile `p`'s retry:; set retry.{key} in the spec, or turn retries off for this "
                           "sweep with retry: {{rounds: 0}})"),
                      ({"retry": {"max_time": 5, "max_mem": "100M"}}, "")]:
        spec.write_text(yaml.safe_dump({"name": "s", "cluster": str(profile), "resources": {"time": 30, "mem": "1G"},
                                        **own}))
        with pytest.raises(LaunchError) as err:
            spec_mod.load(spec, tmp_path)
        assert err.value.problems == [
            "retry.max_time: 00:05:00 is less than resources.time 00:30:00; a retry never asks for less"
            + said.format(key="max_time"),
            "retry.max_mem: 100 MB is less than resources.mem 1024 MB; a retry never asks for less"
            + said.format(key="max_mem")]
