"""Programs that are not ours, launched with `command:` on the real local cluster: each keeps the run contract and
nothing else (tests/support/foreign). The stop signal before the time limit, a preemption and a `scancel -s`
reach the program through the process beside it (node/supervise.py); a program that saves and exits 75 is
requeued and resumes exactly; a silent heartbeat is a hang; a failed run is resubmitted.

Whatever the machine's speed: a run that is to be interrupted counts towards a goal no machine reaches first, and
once the interruption has happened the test writes the real goal into the run's directory, which count.sh reads."""

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT
from tests.support.processes import launch, wait_until
from tests.support.slurm import (
    cancel,
    manifest_of,
    python,
    run_to_completion,
    signal_steps,
    take_every_node,
    unique_name,
    wait,
)
from tinygpt.launch import manifest as manifest_mod
from tinygpt.launch.read import run_states

pytestmark = pytest.mark.slurm

FOREIGN = ROOT / "tests" / "support" / "foreign"
FAR = 10**6  # a goal no machine reaches before the test sets the real one


def launch_command(tmp_path: Path, command: dict, *flags: str, **extra) -> tuple[Path, Path, manifest_mod.Manifest]:
    name = unique_name("command")
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump({"name": name, "command": {"project": str(FOREIGN), **command},
                                    "resources": {"time": "00:05:00"}, **extra}))
    work = tmp_path / "work"
    out = launch(str(spec), "--workdir", str(work), *flags)
    assert out.returncode == 0, out.stdout + out.stderr
    return spec, work, manifest_of(work, name)


def lines(run_dir: Path) -> list[dict]:
    """The program's own lines of metrics.jsonl (not the launcher's record that the run finished)."""
    path = run_dir / "metrics.jsonl"
    said = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [r for r in said if r.get("event") != "finished"]


def logs(work: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted((work / "logs").rglob("*.out")))


def row(manifest: manifest_mod.Manifest) -> run_states.Row:
    return run_states.collect(manifest_mod.load(manifest.path))[0]


@pytest.mark.shares_cluster
def test_a_pytorch_script_of_its_own_stopped_by_the_signal_resumes_to_an_uninterrupted_runs_weights(tmp_path):
    """fit.py, argparse and torch.save of its own: `scancel -s USR2` (what Slurm sends before the time limit)
    stops it mid-training; it saves and exits 75, the task is requeued, and the next life ends with the weights
    of the same script run here without a stop."""
    argv = [python(), "fit.py", "--lr", "{lr}", "--steps", "40", "--step-s", "0.2", "--out", "{run_dir}"]
    _, work, manifest = launch_command(tmp_path, {"argv": argv, "values": {"lr": 0.05}})
    job, run_dir = manifest.task_job_ids()[0], Path(manifest.runs[0].out_dir)
    try:
        wait_until(lambda: len(lines(run_dir)) >= 5, timeout=120, what="fit.py training")
        signal_steps(job)
        state, restarts = run_to_completion(job)
    finally:
        cancel(job)
    assert (state, restarts) == ("COMPLETED", 1), logs(work)
    assert "resumed at step" in logs(work) and "saved and asks to be requeued" in logs(work)
    assert [r["step"] for r in lines(run_dir)] == list(range(1, 41))  # (every step once, across both lives)
    reference = tmp_path / "reference"
    reference.mkdir()
    subprocess.run([python(), str(FOREIGN / "fit.py"), "--lr", "0.05", "--steps", "40", "--out", str(reference)],
                   check=True, timeout=120, capture_output=True)
    assert (run_dir / "weights.json").read_text() == (reference / "weights.json").read_text()
    assert (row(manifest).state.name, row(manifest).step) == ("COMPLETED", 40)


@pytest.mark.shares_cluster
def test_the_time_limit_stops_a_shell_program_which_is_requeued_and_counts_every_step_once(tmp_path):
    """count.sh, not Python: Slurm's own warning before a one-minute limit (the profile's signal, 30 s before)."""
    _, work, manifest = launch_command(tmp_path, {"argv": ["./count.sh", str(FAR)]},
                                       resources={"time": "00:01:00"})
    job, run_dir = manifest.task_job_ids()[0], Path(manifest.runs[0].out_dir)
    try:
        saved = int(wait_until(lambda: (run_dir / "count").exists() and (run_dir / "count").read_text().strip(),
                               timeout=240, what="the time-limit signal"))
        (run_dir / "goal").write_text(str(saved + 3))
        state, restarts = run_to_completion(job)
    finally:
        cancel(job)
    assert (state, restarts) == ("COMPLETED", 1), logs(work)
    assert [r["step"] for r in lines(run_dir)] == list(range(1, saved + 4))
    assert f"saved at {saved}" in logs(work) and f"counted to {saved + 3}" in logs(work)


@pytest.mark.shares_cluster
def test_a_program_whose_heartbeat_stops_is_stopped_as_hung_and_not_requeued(tmp_path):
    _, work, manifest = launch_command(tmp_path, {"argv": ["./count.sh", "100", "hang"], "heartbeat_s": 3})
    job = manifest.task_job_ids()[0]
    try:
        state = wait(job, timeout=180)
    finally:
        cancel(job)
    assert state == "FAILED", logs(work)
    assert "heartbeat is" in logs(work) and "hung; stopping it" in logs(work)
    shown = row(manifest)
    assert shown.state == "HUNG at step 3" and shown.restarts == 0


@pytest.mark.shares_cluster
def test_a_failed_run_packed_beside_a_finished_one_is_said_and_resubmitted_alone(tmp_path):
    """Two runs of count.sh in one task, each counting in its own log: b's first life fails (exit 3), so the task
    ends FAILED, yet a, which counted to its end, shows FINISHED (its run's own record); `resubmit` sends the task
    again for b, in which a is not started again (its count and its log say it ran once) and b counts to its end."""
    spec, work, manifest = launch_command(
        tmp_path, {"argv": ["./count.sh", "2", "{mode}"]}, runs=[{"name": "a", "mode": "once"},
                                                                  {"name": "b", "mode": "fail-once"}],
        pack=2, resources={"time": "00:05:00", "cpus_per_task": 2})
    ids = manifest.task_job_ids()
    assert ids[0] == ids[1]  # (one task holds both)
    try:
        assert wait(ids[0], timeout=120) == "FAILED"
    finally:
        cancel(ids[0])
    assert "error: the first life of this run fails" in logs(work)
    states = lambda: [r.state.name for r in run_states.collect(manifest_mod.load(manifest.path))]  # noqa: E731
    wait_until(lambda: states() == ["FINISHED", "FAILED"], timeout=60, what="status: a FINISHED, b FAILED")
    again = launch("resubmit", str(spec), "--workdir", str(work))
    assert again.returncode == 0 and "b (" in again.stdout and "a (" not in again.stdout, again.stdout
    second = manifest_mod.load(manifest.path).task_job_ids()[0]
    try:
        assert second != ids[0] and wait(second, timeout=120) == "COMPLETED"
    finally:
        cancel(second)
    assert states() == ["COMPLETED", "COMPLETED"]
    a, b = (sorted((work / "logs").rglob(f"*run{i}*.out")) for i in (0, 1))
    a_said = "\n".join(p.read_text() for p in a)
    assert a_said.count("counted to 2") == 1 and "run a finished in an earlier life" in a_said, a_said
    assert "counted to 2" in "\n".join(p.read_text() for p in b)
    assert [r["step"] for r in lines(Path(manifest.runs[0].out_dir))] == [1, 2]


def test_a_preempted_helper_program_is_requeued_by_slurm_and_resumes_exactly(tmp_path):
    """fit_with_helper.py in partition `low`: a job of `high` takes every node (PreemptMode=REQUEUE: SIGTERM, then
    Slurm requeues it); the helper saved on the signal, the next life ends where an uninterrupted run does."""
    argv = [python(), "fit_with_helper.py", "--lr", "0.05", "--steps", "{steps}", "--step-s", "0.1"]
    _, work, manifest = launch_command(tmp_path, {"argv": argv, "values": {"steps": FAR}},
                                       resources={"time": "00:05:00", "partition": "low", "cpus_per_task": 2})
    job, run_dir = manifest.task_job_ids()[0], Path(manifest.runs[0].out_dir)
    high = None
    try:
        wait_until(lambda: len(lines(run_dir)) >= 5, timeout=120, what="the helper program training")
        high = take_every_node()
        saved = wait_until(lambda: json.loads((run_dir / "state.json").read_text())["step"]
                           if (run_dir / "state.json").exists() else None, timeout=120, what="the preemption")
        _goal(manifest, saved + 10)
        state, restarts = run_to_completion(job)
        assert wait(high) == "COMPLETED"
    finally:
        cancel(job, *([high] if high else []))
    assert (state, restarts) == ("COMPLETED", 1), logs(work)
    expected = subprocess.run([python(), str(FOREIGN / "fit_with_helper.py"), "--lr", "0.05", "--steps",
                               str(saved + 10)], capture_output=True, text=True, timeout=60,
                              cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "TINYGPT_RUN_DIR": str(tmp_path / "ref")})
    assert json.loads((run_dir / "weights.json").read_text()) == json.loads(expected.stdout)


@pytest.mark.shares_cluster
def test_a_ddp_script_under_torchrun_on_two_nodes_stopped_by_the_signal_resumes_to_an_uninterrupted_runs_weights(
        tmp_path):
    """ddp_fit.py, plain torch.distributed, `start: torchrun`: one torchrun per node joined by its c10d rendezvous,
    one worker each. `scancel -s USR2` (what Slurm sends before the time limit) reaches the workers through
    torchrun; they save and exit 75, which torchrun hides and the node's supervisor says again; the task is
    requeued, and the next life ends with the weights of the same script run here under torchrun, unstopped."""
    argv = [python(), "ddp_fit.py", "--lr", "0.05", "--steps", "{steps}", "--step-s", "0.1", "--out", "{run_dir}"]
    _, work, manifest = launch_command(tmp_path, {"argv": argv, "values": {"steps": FAR}, "start": "torchrun"},
                                       resources={"nodes": 2, "tasks_per_node": 1, "time": "00:05:00"})
    job, run_dir = manifest.task_job_ids()[0], Path(manifest.runs[0].out_dir)
    try:
        wait_until(lambda: len(lines(run_dir)) >= 3, timeout=180, what="ddp_fit.py training on two nodes")
        signal_steps(job)
        wait_until(lambda: (run_dir / "ckpt.pt").exists(), timeout=120, what="the workers' checkpoint")
        saved = wait_until(lambda: "stopped at step" in logs(work) and lines(run_dir)[-1]["step"], timeout=60,
                           what="the workers' exit")
        _goal(manifest, saved + 3)
        state, restarts = run_to_completion(job)
    finally:
        cancel(job)
    assert (state, restarts) == ("COMPLETED", 1), logs(work)
    assert "saved and asks to be requeued" in logs(work) and "rank 1 of 2 resumed" in logs(work)
    assert [(r["step"], r["world"]) for r in lines(run_dir)] == [(s, 2) for s in range(1, saved + 4)]
    reference = tmp_path / "reference"
    reference.mkdir()
    subprocess.run([python(), "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                    str(FOREIGN / "ddp_fit.py"), "--lr", "0.05", "--steps", str(saved + 3), "--out", str(reference)],
                   check=True, timeout=120, capture_output=True)
    assert (run_dir / "weights.json").read_text() == (reference / "weights.json").read_text()


def _goal(manifest: manifest_mod.Manifest, steps: int) -> None:
    """The run's real end, in the manifest every start of it reads (the value of its `{steps}`)."""
    text = manifest.path.read_text()
    assert text.count(f'"steps": {FAR}') == 1
    manifest.path.write_text(text.replace(f'"steps": {FAR}', f'"steps": {steps}'))


@pytest.mark.shares_cluster
def test_a_chain_of_a_program_runs_its_array_then_its_report_without_a_data_step(tmp_path):
    _, work, manifest = launch_command(tmp_path, {"argv": ["python3", "train.py", "--lr", "{lr}", "--steps", "20"],
                                                  "project": str(ROOT / "hpc_lab" / "05_own_program")},
                                       "--chain", grid={"lr": [0.1, 0.2]})
    assert [s.role for s in manifest.submissions] == [None, "report"]
    report = manifest.submissions[-1].job_id
    try:
        assert wait(report, timeout=180) == "COMPLETED"
    finally:
        cancel(report)
    text = (work / "runs" / manifest.name / "report.md").read_text()
    assert "![loss](loss.png)" in text and "| lr-0.2 | 0.2 | 20 |" in text


@pytest.mark.shares_cluster
def test_an_optuna_search_of_a_program_on_the_cluster_scores_each_trial_by_its_named_metric(tmp_path):
    _, work, manifest = launch_command(
        tmp_path, {"argv": ["python3", "train.py", "--lr", "{lr}", "--steps", "10"],
                   "project": str(ROOT / "hpc_lab" / "05_own_program")},
        search={"method": "optuna", "trials": 2, "workers": 1, "seed": 0, "metric": "loss", "value": "best",
                "params": {"lr": {"uniform": [0.05, 0.2]}}})
    job = manifest.task_job_ids()[0]
    try:
        assert wait(job, timeout=120) == "COMPLETED", logs(work)
    finally:
        cancel(job)
    shown = launch("status", str(manifest.spec), "--workdir", str(work)).stdout
    assert shown.count("COMPLETE ") >= 2 and "lr=0." in shown, shown  # (a trial's values, as drawn)
