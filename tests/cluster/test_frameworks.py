"""Programs written with the frameworks people train with, run through `command:` as they are, on the real local
cluster under a retry policy: one array per framework whose runs meet the ends a run meets (the warning before the
time limit, a bug, memory over the request), told apart and each handled as the policy says.

PyTorch Lightning (tests/support/foreign/lightning_fit.py) owns its requeue: its SLURMEnvironment traps the signal
the spec names (`command.signal: USR1`), saves, and runs `scontrol requeue` itself; Slurm then ends the life with
SIGTERM, which Lightning answers by ending 0, and the next life's fit() starts from its hpc_ckpt. The launcher sends
the signal and reads the ends; it never requeues such a program a second time, nor reads that requeue as a death.
A Hugging Face Trainer script (hf_fit.py) has no handler: the warning ends it, the policy sends it again with more
time, and that life resumes from its newest checkpoint-N (`resume: {when: checkpoint-*, add:
[--resume_from_checkpoint, "{resume}"]}`).

The warning is sent as Slurm sends it (`scancel -s SIG` to the job's steps) once the program has stepped: slurmctld
itself sends it at its next look at the time limits, up to 30 s later.
"""

import subprocess
from pathlib import Path

import pytest

from tests.cluster.test_commands import lines
from tests.cluster.test_retry import FOREIGN, every_job, launch_spec, logs, sent
from tests.support.processes import launch, wait_until
from tests.support.slurm import cancel, manifest_of, python
from tinygpt.launch import manifest as manifest_mod
from tinygpt.launch.read import run_states

pytestmark = [pytest.mark.slurm, pytest.mark.shares_cluster]

CASES = [{"name": "time", "hold_at": 3}, {"name": "bug", "fail_at": 2}, {"name": "oom", "hold_mb": 1200}]
RESOURCES = {"time": 5, "mem": "1G", "sbatch_options": {"acctg-freq": 1}}  # (a framework's import: ~380 MB)


def steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in lines(run_dir)]


def run_sweep(tmp_path: Path, command: dict, signal: str) -> tuple[Path, Path, str, str]:
    """Launch `command` over CASES under a one-retry policy, send the `time` run the warning once its first life
    holds at step 3 (as a long step would: no race with its end), and wait for the summary: (spec, work, name,
    summary text)."""
    spec, work, name = launch_spec(tmp_path, {
        "runs": CASES, "retry": {"rounds": 2}, "resources": RESOURCES,
        "command": {"project": str(FOREIGN), "values": {"fail_at": -1, "hold_mb": 0, "hold_at": -1}, **command}})
    manifest = manifest_of(work, name)
    try:
        timed = manifest.find("time")[0]
        wait_until(lambda: len(steps(Path(timed.out_dir))) >= 3, timeout=120, poll=0.2, what="the program stepping")
        # (its status is not checked: scancel may say 229 when the step it signals ends as it is signalled; the
        # summary says what the signal did)
        subprocess.run(["scancel", "-s", signal, f"{manifest.task_job_ids()[timed.index]}.0"], timeout=30)
        summary = work / "runs" / name / "summary.md"
        wait_until(summary.exists, timeout=420, poll=1, what=lambda: f"the summary\n{logs(work)}")
    finally:
        cancel(*every_job(manifest_of(work, name)))
    return spec, work, name, summary.read_text()


def told_apart(summary: str, time_row: str) -> None:
    """The summary's rows: the `time` run's as given, the bug given up with its error line, the OOM sent again with
    twice the memory."""
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in summary.splitlines()
            if line.startswith("| ") and line.split(" | ")[0].removeprefix("| ") in ("time", "bug", "oom")}
    assert rows["time"] == time_row, summary
    assert rows["bug"].startswith("| bug | 1 | program | as launched | given up: a failure of the program"), summary
    assert "ValueError: bad batch at step 2" in summary
    assert rows["oom"] == "| oom | 2 | out_of_memory, finished | as launched; --mem=2048M | finished |", summary


def lives(run_dir: Path) -> tuple[list[int], int]:
    """The steps a run recorded, and where its second life's begin."""
    said = steps(run_dir)
    return said, next(i for i in range(1, len(said)) if said[i] <= said[i - 1])


def test_a_lightning_script_requeues_itself_once_resumes_and_its_bug_and_oom_are_told_apart(tmp_path):
    argv = [python(), "lightning_fit.py", "--root", "{run_dir}", "--max-steps", "12", "--hold-at", "{hold_at}",
            "--fail-at", "{fail_at}", "--hold-mb", "{hold_mb}"]
    spec, work, name, summary = run_sweep(tmp_path, {
        "argv": argv, "signal": "USR1", "progress": [r"step (?P<step>\d+): train_loss (?P<train_loss>[\d.]+)"]},
        "USR1")
    manifest = manifest_of(work, name)
    told_apart(summary, "| time | 1 | finished | as launched | finished |")
    timed = manifest.find("time")[0]
    said, resumed = lives(Path(timed.out_dir))
    # (its checkpoint is taken where the signal finds it, within a step: the next life starts at that step)
    assert 0 < said[resumed] <= said[resumed - 1] and said[-1] == 11, said
    assert (Path(timed.out_dir) / "hpc_ckpt_1.ckpt").exists()
    assert [s.changes for s in sent(manifest, "time")] == [None]  # (Lightning's requeue, never the policy's)
    def accounted():  # (status's row, once accounting has the requeued job's every life)
        row = next(r for r in run_states.collect(manifest_mod.load(manifest.path)) if r.name == "time")
        return row.source == "sacct" and (row.state.name, row.restarts)
    assert wait_until(accounted, timeout=60, what="accounting's record") == ("COMPLETED", 1)
    text = logs(work)
    assert "without saving" not in text and "asks to be requeued" not in text, text
    status = launch("status", str(spec), "--workdir", str(work))
    assert f"retry: done: sweep {name}: 2 of 3 run(s) finished" in status.stdout, status.stdout


def test_a_hugging_face_trainer_script_dies_of_the_warning_and_resumes_from_its_newest_checkpoint(tmp_path):
    argv = [python(), "hf_fit.py", "--output_dir", "{run_dir}", "--max_steps", "12", "--save_steps", "2",
            "--logging_steps", "1", "--report_to", "none", "--disable_tqdm", "true", "--use_cpu", "true",
            "--per_device_train_batch_size", "8", "--hold_at", "{hold_at}", "--fail_at", "{fail_at}", "--hold_mb",
            "{hold_mb}"]
    spec, work, name, summary = run_sweep(tmp_path, {
        "argv": argv, "progress": [r"step (?P<step>\d+): loss (?P<train_loss>[\d.]+)"],
        "resume": {"when": "checkpoint-*", "add": ["--resume_from_checkpoint", "{resume}"]}}, "USR2")
    manifest = manifest_of(work, name)
    told_apart(summary, "| time | 2 | time_limit, finished | as launched; --time=00:10:00 | finished |")
    timed = manifest.find("time")[0]
    said, resumed = lives(Path(timed.out_dir))
    saved = max(s for s in said[:resumed] if s % 2 == 0)  # (its newest checkpoint before the warning)
    assert said[resumed] == saved + 1 and said[-1] == 12, said
    assert f"--resume_from_checkpoint {timed.out_dir}/checkpoint-{saved}" in logs(work)
    status = launch("status", str(spec), "--workdir", str(work))
    assert f"retry: done: sweep {name}: 2 of 3 run(s) finished" in status.stdout, status.stdout
