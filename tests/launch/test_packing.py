"""`pack: K`: K runs at once in each array task, each its own srun step, log and run directory."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT
from tests.support.processes import wait_until
from tests.support.slurm import (
    held_at_first_save,
    job_env,
    manifest_of,
    run_to_completion,
    signal_steps,
    training,
    wait,
)
from tests.support.tiny import read_metrics, tiny_train
from tinygpt.launch.errors import LaunchError
from tinygpt.launch.spec import sweep as spec_mod
from tinygpt.launch.submit.plan import build

TINY = tiny_train(eval_interval=20, ckpt_interval=10, log_interval=5)


def spec_file(tmp_path: Path, corpus: Path, name: str, pack: int, max_steps: int = 40, **extra) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "train": {**TINY, "data_file": str(corpus), "max_steps": max_steps},
                                    "grid": {"seed": [1, 2, 3, 4, 5][:extra.pop("runs", 4)]}, "pack": pack,
                                    "resources": {"time": "00:10:00", "cpus_per_task": 2}, **extra}))
    return path


def test_a_packed_task_starts_its_runs_and_requeues_when_one_asks(tmp_path, tiny_corpus):
    """The script's own logic, with stand-ins for srun and Python (what a cluster cannot show on demand: which
    exit statuses lead to a requeue)."""
    plan = build(spec_mod.load(spec_file(tmp_path, tiny_corpus, "five", 2, runs=5), tmp_path / "w"))
    (script, array, offset, indices), = plan.scripts
    assert (array, offset, indices) == ("0-2", 0, [0, 1, 2, 3, 4])
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "srun").write_text('#!/bin/bash\necho "srun $* requeue=$TINYGPT_REQUEUE"\n'
                                'case "$*" in */cfg/run1*) exit "${CODE_OF_RUN1:-0}";; esac\n')
    (stubs / "scontrol").write_text('#!/bin/bash\necho "scontrol $*"\n')
    (stubs / "python").write_text(
        '#!/bin/bash\n[ "$2" = tinygpt.launch.node.run_config ] && echo "/cfg/run$4" || echo "$@"\n')
    text = script.read_text().replace("PYTHON=", f"PYTHON={stubs}/python #", 1)
    for stub in stubs.iterdir():
        stub.chmod(0o755)

    def task(task_id: int, **env) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", text], capture_output=True, text=True, env={
            **os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "SLURM_ARRAY_TASK_ID": str(task_id),
            "SLURM_ARRAY_JOB_ID": "77", "SLURM_CPUS_PER_TASK": "4", **env})

    first = task(1)
    assert first.returncode == 0, first.stderr
    logs = sorted(p.name for p in (tmp_path / "w" / "logs" / "five").glob("77_1.run*.out"))
    assert logs == ["77_1.run2.out", "77_1.run3.out"]  # task 1 holds runs 2 and 3
    calls = "".join((tmp_path / "w" / "logs" / "five" / name).read_text() for name in logs)
    assert calls.count("srun --overlap --ntasks=1 --nodes=1 --cpus-per-task=2 ") == 2  # each half the task's 4 CPUs
    assert calls.count("requeue=script") == 2
    assert "/cfg/run2" in calls and "/cfg/run3" in calls
    assert task(2).returncode == 0
    last = sorted(p.name for p in (tmp_path / "w" / "logs" / "five").glob("77_2.run*.out"))
    assert last == ["77_2.run4.out"]  # the last task holds the one run left
    requeued = task(0, CODE_OF_RUN1="75")  # run 1 saved and asks for a requeue; run 0 finished
    assert requeued.returncode == 0 and "scontrol requeue 77_0" in requeued.stdout
    failed = task(0, CODE_OF_RUN1="3")
    assert failed.returncode == 3 and "scontrol" not in failed.stdout


def test_pack_is_checked(tmp_path, tiny_corpus):
    for pack, backend, message in [(0, "sbatch", "pack: must be >= 1, got 0"),
                                   (2, "submitit", "pack: packing runs into one task is for the sbatch backend"),
                                   (2, "sbatch", "pack: packed runs are one process each"),
                                   (3, "sbatch", r"pack: 3 runs at once would share 2 CPU\(s\) .* more runs than")]:
        extra = {"resources": {"nodes": 2}} if "one process" in message else {}
        with pytest.raises(LaunchError, match=message):
            spec_mod.load(spec_file(tmp_path, tiny_corpus, "p", pack, backend=backend, **extra), tmp_path)


@pytest.mark.slurm_release
@pytest.mark.slurm
@pytest.mark.shares_cluster
def test_a_signal_to_a_packed_task_requeues_it_and_both_runs_resume_exactly(tmp_path, tiny_corpus):
    from tinygpt.base import config
    from tinygpt.training import trainer

    work, gate = tmp_path / "w", tmp_path / "both-training"
    spec = spec_file(tmp_path, tiny_corpus, "packed", 2, runs=2)
    # Each run holds its first checkpoint until the gate opens: the signal finds both training, however far
    # apart their steps started (run 0 had once finished before run 1 had imported torch).
    env = job_env(**held_at_first_save(gate))
    out = subprocess.run([sys.executable, str(ROOT / "launch.py"), str(spec), "--workdir", str(work)],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    manifest = manifest_of(work, "packed")
    ids = manifest.task_job_ids()
    assert ids[0] == ids[1]  # one task, two runs
    runs = [Path(r.out_dir) for r in manifest.runs]
    wait_until(lambda: all(training(run / "metrics.jsonl") for run in runs), timeout=120, what="both runs training")
    signal_steps(ids[0])
    gate.touch()
    assert run_to_completion(ids[0], timeout=400) == ("COMPLETED", 1)
    for index, run_dir in enumerate(runs):
        records = read_metrics(run_dir)
        starts = [r for r in records if r.get("event") == "start"]
        assert len(starts) == 2 and starts[1]["step"] > 0, records  # both saved, both resumed
        assert any(r.get("event") == "preempted" for r in records)
        reference = config.resolve(["--config", str(run_dir / "config.yaml"), "--progress", "plain",
                                    "--out-dir", str(tmp_path / f"ref{index}")])
        assert trainer.train(reference).finished
        assert records[-1]["weights_digest"] == read_metrics(tmp_path / f"ref{index}")[-1]["weights_digest"]
        log = (work / "logs" / "packed" / f"{ids[0]}.run{index}.out").read_text()
        assert "restart 0" in log and "restart 1" in log and "done: step 40" in log
    assert wait(ids[0]) == "COMPLETED"
