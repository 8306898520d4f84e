"""The launcher and the hand-written batch script against the real local cluster."""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tests.support.processes import launch
from tests.support.slurm import cancel, counting_shim, manifest_of, queued, sbatch, step_cpus, wait, wait_until
from tests.support.sweeps import sweep_dirs
from tests.support.tiny import read_metrics, tiny_train, tiny_yaml
from tinygpt.launch import manifest as manifest_mod

pytestmark = [pytest.mark.slurm, pytest.mark.shares_cluster]

TINY_TRAIN = tiny_yaml(max_steps=20, eval_interval=10)


def job_ids(workdir: Path, name: str) -> list[str]:
    return [s.job_id for s in manifest_of(workdir, name).submissions]


def wait_all(workdir: Path, name: str, timeout: float = 300) -> dict[str, str]:
    manifest = manifest_of(workdir, name)
    return {manifest.runs[i].name: wait(j, timeout=timeout) for i, j in manifest.task_job_ids().items()}


@pytest.fixture
def workdir(tmp_path):
    w = tmp_path / "work dir"  # a space in every generated path: the quoting is exercised for real
    w.mkdir()
    yield w
    for m in (w / "jobs").glob("*/manifest.json"):
        cancel(*[s.job_id for s in manifest_mod.load(m).slurm_submissions()])


@pytest.fixture
def sbatch_counter(tmp_path):
    """A real sbatch behind a counter on PATH, to count how many times the launcher calls it."""
    return counting_shim(tmp_path, "sbatch")


def sweep_spec(tmp_path: Path, corpus: Path, name: str, extra: str = "") -> Path:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(f"name: {name}\ncluster: local\ntrain: {{data_file: {corpus}, {TINY_TRAIN}}}\n"
                    f"grid:\n  n_layer: [1, 2]\n  lr: [1.0e-3, 2.0e-3]\nresources: {{time: '00:10:00'}}\n{extra}")
    return spec


def test_sweep_is_one_sbatch_call_and_every_run_completes(tmp_path, workdir, tiny_corpus, sbatch_counter):
    env, count = sbatch_counter
    spec = sweep_spec(tmp_path, tiny_corpus, "sweep4", "array_parallelism: 4\n")
    out = launch(str(spec), "--cluster", "local", "--workdir", str(workdir), env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    calls = count.read_text().splitlines()  # ONE job array, after `launch.py check`'s --test-only of its script
    assert len(calls) == 2 and calls[0].startswith("--test-only ") and not calls[1].startswith("--test-only"), calls
    states = wait_all(workdir, "sweep4")
    assert set(states.values()) == {"COMPLETED"}, states
    run_dirs = sorted(p.name for p in (workdir / "runs" / "sweep4").iterdir())
    assert run_dirs == sorted(["n_layer-1_lr-0.001", "n_layer-1_lr-0.002", "n_layer-2_lr-0.001", "n_layer-2_lr-0.002"])
    for d in run_dirs:
        assert read_metrics(workdir / "runs" / "sweep4" / d)[-1]["event"] == "finished"
    logs = list((workdir / "logs" / "sweep4").glob("*.out"))
    assert len(logs) == 4 and all("done: step 20" in p.read_text() for p in logs)

    def accounted() -> bool:  # every run COMPLETED, as accounting says (it hears of an end a moment late)
        status = launch("status", str(spec), "--workdir", str(workdir))
        rows = [line for line in status.stdout.splitlines() if "COMPLETED" in line]
        return status.returncode == 0 and len(rows) == 4 and all("sacct" in row for row in rows)

    wait_until(accounted, timeout=60, poll=0.5, what="status showing the four runs COMPLETED from sacct")


def test_submitit_backend_completes_the_same_sweep(tmp_path, workdir, tiny_corpus):
    spec = sweep_spec(tmp_path, tiny_corpus, "sub4")
    out = launch(str(spec), "--backend", "submitit", "--workdir", str(workdir))
    assert out.returncode == 0, out.stdout + out.stderr
    states = wait_all(workdir, "sub4")
    assert set(states.values()) == {"COMPLETED"}, states
    for run in manifest_of(workdir, "sub4").runs:
        assert read_metrics(Path(run.out_dir))[-1]["event"] == "finished"


@pytest.mark.slurm_release
def test_a_two_node_run_puts_one_rank_on_each_node_with_the_cpus_it_asked_for(tmp_path, workdir, tiny_corpus):
    """Each rank gets the CPUs the spec asks for: srun's step holds them (sacct), Slurm tells the rank
    (SLURM_CPUS_PER_TASK) and torch runs that many threads, on every release (tinygpt/launch/submit/sbatch.py says them
    on srun's line)."""
    spec = tmp_path / "two.yaml"
    spec.write_text(f"name: two\ntrain: {{data_file: {tiny_corpus}, {tiny_yaml(max_steps=20, threads=None)}}}\n"
                    f"resources: {{nodes: 2, tasks_per_node: 1, cpus_per_task: 2, time: '00:10:00'}}\n")
    out = launch(str(spec), "--workdir", str(workdir))
    assert out.returncode == 0, out.stdout + out.stderr
    assert wait_all(workdir, "two") == {"base": "COMPLETED"}
    start = read_metrics(workdir / "runs" / "two" / "base")[0]
    assert start["world_size"] == 2 and sorted(start["hostnames"]) == ["node1", "node2"]
    assert [(rank["cpus_per_task"], rank["threads"]) for rank in start["cpus"]] == [(2, 2), (2, 2)], start
    assert step_cpus(job_ids(workdir, "two")[0], 1) == {"0": 4}  # the trainers' step: two tasks of two CPUs


def test_dry_run_leaves_the_queue_untouched(tmp_path, workdir, tiny_corpus, sbatch_counter):
    env, count = sbatch_counter
    out = launch(str(sweep_spec(tmp_path, tiny_corpus, "dry")), "--dry-run", "--workdir", str(workdir), env=env)
    assert out.returncode == 0 and "nothing submitted" in out.stdout
    assert not count.exists()  # sbatch never called
    assert manifest_of(workdir, "dry").submissions == []
    assert queued("dry") == []  # nothing of this sweep in the queue


@pytest.mark.slurm_release
def test_status_and_cancel_of_a_pending_sweep(tmp_path, workdir, tiny_corpus):
    spec = sweep_spec(tmp_path, tiny_corpus, "held")
    out = launch(str(spec), "--workdir", str(workdir), "--hold")
    assert out.returncode == 0, out.stderr
    array = job_ids(workdir, "held")[0]
    status = launch("status", str(spec), "--workdir", str(workdir))
    assert status.stdout.count("PENDING") == 4 and f"{array}_0" in status.stdout, status.stdout
    cancelled = launch("cancel", str(spec), "--workdir", str(workdir))
    assert cancelled.returncode == 0 and array in cancelled.stdout
    states = wait_all(workdir, "held")
    assert set(states.values()) == {"CANCELLED"}


@pytest.mark.parametrize("from_own_folder", [pytest.param(False, marks=pytest.mark.slurm_release), True],
                         ids=["repo-root", "own-folder"])
def test_hand_written_train_sbatch_forwards_every_argument(tmp_path, tiny_corpus, from_own_folder):
    out_dir = tmp_path / "run"
    cwd = ROOT / "hpc_lab" / "04_tinygpt" if from_own_folder else ROOT
    script = "train.sbatch" if from_own_folder else "hpc_lab/04_tinygpt/train.sbatch"
    job = sbatch(script, "--data-file", str(tiny_corpus), "--n-layer", "1", "--n-head", "2", "--n-embd", "32",
                 "--block-size", "16", "--max-steps", "20", "--sample-tokens", "0", "--out-dir", str(out_dir),
                 "--data-dir", str(tmp_path / "data"), "--threads", "1", cwd=cwd)
    log = ROOT / "logs" / f"tinygpt-{job}.out"
    try:
        assert wait(job) == "COMPLETED", log.read_text() if log.exists() else "no log"
        records = read_metrics(out_dir)
        assert records[-1]["event"] == "finished" and records[-1]["step"] == 20
        text = log.read_text()
        assert "train.sbatch: job" in text and "done: step 20" in text
    finally:
        cancel(job)
        log.unlink(missing_ok=True)


@pytest.mark.slurm_release
def test_failed_sbatch_reports_sbatchs_own_message(tmp_path, workdir, tiny_corpus):
    spec = sweep_spec(tmp_path, tiny_corpus, "toomuch")
    spec.write_text(spec.read_text().replace("resources: {time: '00:10:00'}",
                                             "resources: {time: '00:10:00', mem: 900G}"))
    prof = tmp_path / "big.yaml"
    prof.write_text("name: big\npartitions: {debug: {}}\nnode: {cpus: 2}\n")
    # Checked first (submit/preflight.py): sbatch --test-only says why in Slurm's words, and nothing is submitted
    out = launch(str(spec), "--cluster", str(prof), "--workdir", str(workdir))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "sbatch --test-only toomuch.sbatch: Slurm would refuse the job: allocation failure: Requested node " \
           "configuration is not available" in out.stderr, out.stderr
    unchecked = launch(str(spec), "--cluster", str(prof), "--workdir", str(workdir), "--no-check")
    assert unchecked.returncode == 1 and "Traceback" not in unchecked.stderr
    assert "sbatch rejected" in unchecked.stderr and "memory" in unchecked.stderr.lower()


@pytest.mark.slurm_release
def test_status_shows_completed_running_and_cancelled_runs(tmp_path, workdir, tiny_corpus):
    spec = tmp_path / "three.yaml"
    train = tiny_yaml(eval_interval=10)
    spec.write_text(f"name: three\ntrain: {{data_file: {tiny_corpus}, {train}}}\n"
                    "runs:\n  - {name: quick, max_steps: 20}\n  - {name: long, max_steps: 200000}\n"
                    "  - {name: doomed, max_steps: 200000}\nresources: {time: '00:10:00'}\n")
    assert launch(str(spec), "--workdir", str(workdir)).returncode == 0
    ids = manifest_of(workdir, "three").task_job_ids()
    assert wait(ids[0]) == "COMPLETED"
    cancel(ids[2])
    assert wait(ids[2]) == "CANCELLED"
    long_metrics = workdir / "runs" / "three" / "long" / "metrics.jsonl"
    wait_until(lambda: long_metrics.exists() and '"lr"' in long_metrics.read_text(), timeout=120, what="training")
    status = launch("status", str(spec), "--workdir", str(workdir))
    rows = {line.split("│")[2].strip(): line for line in status.stdout.splitlines() if line.count("│") > 10}
    assert "COMPLETED" in rows["quick"] and "20/20" in rows["quick"]
    assert "RUNNING" in rows["long"] and "/200000" in rows["long"]
    assert "CANCELLED" in rows["doomed"]


@pytest.mark.parametrize("backend", ["sbatch", "submitit"])
def test_a_failing_setup_line_ends_the_job_naming_it(tmp_path, workdir, tiny_corpus, backend):
    """A module that does not load ends the job: it never trains in an environment nobody asked for."""
    profile = tmp_path / "broken-site.yaml"
    profile.write_text((ROOT / "hpc_lab" / "clusters" / "local.yaml").read_text()
                       + "setup: [\"echo setup-began\", \"module load no-such-module\", \"echo setup-went-on\"]\n")
    spec = tmp_path / "broken.yaml"
    spec.write_text(f"name: broken\ncluster: {profile}\nbackend: {backend}\ntrain: {{data_file: {tiny_corpus}, "
                    f"{TINY_TRAIN}}}\nresources: {{time: '00:05:00'}}\n")
    out = launch(str(spec), "--workdir", str(workdir))
    assert out.returncode == 0, out.stdout + out.stderr
    assert set(wait_all(workdir, "broken").values()) == {"FAILED"}
    logs = "\n".join(p.read_text() for p in (workdir / "logs" / "broken").rglob("*") if p.suffix in (".out", ".err"))
    assert "tinygpt: setup failed (exit status 127): module load no-such-module" in logs, logs
    assert "setup-began" in logs and "setup-went-on" not in logs
    run_dir = Path(manifest_of(workdir, "broken").runs[0].out_dir)
    assert not (run_dir / "metrics.jsonl").exists()  # the trainer never started


def test_a_live_sweep_is_never_changed_behind_its_jobs(tmp_path, workdir, tiny_corpus):
    """A spec launched again while its sweep is queued never rewrites what the queued tasks will read: its run,
    now defined otherwise, is refused (a relaunch), and so is a --local run of it."""
    import hashlib

    def checksums() -> dict:
        return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sweep_dirs(workdir, "live").jobs.rglob("*")
                if p.is_file()}

    spec = sweep_spec(tmp_path, tiny_corpus, "live")
    assert launch(str(spec), "--hold", "--workdir", str(workdir)).returncode == 0
    before = checksums()
    spec.write_text(spec.read_text().replace("max_steps: 20", "max_steps: 27"))
    for extra in (["--dry-run"], [], ["--fresh"]):  # (a relaunch: the run, queued, is now defined otherwise)
        again = launch(str(spec), *extra, "--workdir", str(workdir))
        assert again.returncode == 1 and "Traceback" not in again.stderr, again.stderr
        assert "that the spec now defines otherwise" in again.stderr and "(a live one: cancel it first)" in \
            again.stderr and "n_layer-1_lr-0.001 (queued " in again.stderr
    local = launch(str(spec), "--local", "--workdir", str(workdir))  # (--local starts over: refused while live)
    assert local.returncode == 1 and "sweep `live` has jobs that are still live: n_layer-1_lr-0.001 (job " in \
        local.stderr and "PENDING" in local.stderr and f"python launch.py cancel {spec}" in local.stderr
    # A controller that does not answer (squeue fails as on a socket time-out): the guard fails closed.
    bindir = tmp_path / "failing-bin"
    bindir.mkdir()
    (bindir / "squeue").write_text("#!/bin/bash\necho 'squeue: error: slurm_load_jobs error: Socket timed out on "
                                   "send/recv operation' >&2\nexit 1\n")
    (bindir / "squeue").chmod(0o755)
    for extra in (["--dry-run"], []):
        blind = launch(str(spec), *extra, "--workdir", str(workdir),
                       env={"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"})
        assert blind.returncode == 1 and "Traceback" not in blind.stderr, blind.stderr
        assert "has jobs on Slurm, and squeue could not say whether they are still live" in blind.stderr
    assert checksums() == before  # every file of the queued sweep as it was
    assert launch("cancel", str(spec), "--workdir", str(workdir)).returncode == 0
    dry = wait_until(lambda: (out := launch(str(spec), "--dry-run", "--fresh", "--workdir", str(workdir))
                              ).returncode == 0 and out, timeout=120, poll=2,
                     what="the cancelled sweep's changed run to be launchable afresh")
    assert "changed" in dry.stdout and "dry run: would submit 4 run(s); nothing written" in dry.stdout


@pytest.mark.slurm_release
@pytest.mark.parametrize("backend", ["sbatch", "submitit"])
def test_passed_through_options_reach_slurm(tmp_path, workdir, tiny_corpus, backend):
    """`exclude`, an extra #SBATCH option and an srun argument, as Slurm sees them."""
    from tests.support.slurm import job_fields

    spec = tmp_path / "through.yaml"
    spec.write_text(f"name: through\nbackend: {backend}\ntrain: {{data_file: {tiny_corpus}, {TINY_TRAIN}}}\n"
                    "resources: {time: '00:05:00', exclude: node1, sbatch_options: {comment: 'it''s$(passed)'}, "
                    "srun_args: [--label]}\n")
    out = launch(str(spec), "--workdir", str(workdir))
    assert out.returncode == 0, out.stdout + out.stderr
    assert wait_all(workdir, "through") == {"base": "COMPLETED"}

    fields = job_fields(manifest_of(workdir, "through").task_job_ids()[0])
    assert fields["NodeList"] == "node2" and fields["Comment"] == "it's$(passed)", fields
    logs = "\n".join(p.read_text() for p in (workdir / "logs" / "through").rglob("*") if p.suffix in (".out", ".err"))
    assert "0: " in logs and any(line.startswith("0: ") and "done: step 20" in line for line in logs.splitlines())
    shown = launch("logs", str(spec), "base", "--workdir", str(workdir))  # found where each backend writes it
    assert shown.returncode == 0 and "==> run base (#0), job " in shown.stdout and " on node2, latest life" in \
        shown.stdout and "done: step 20" in shown.stdout, shown.stdout + shown.stderr


@pytest.mark.slurm_release
def test_arrays_are_split_at_the_reachable_clusters_max_array_size(tmp_path, workdir):
    """Slurm's own MaxArraySize (1001 here) when the profile names the reachable cluster; the profile's
    otherwise (a dry run for another cluster)."""
    from tinygpt.launch.spec.sweep import load
    from tinygpt.launch.submit.plan import build

    spec = tmp_path / "seven.yaml"
    spec.write_text("name: seven\ngrid: {seed: [1, 2, 3, 4, 5, 6, 7]}\n")
    parts = {}
    for cluster_name in ("local", "elsewhere"):
        prof = tmp_path / f"{cluster_name}.yaml"
        prof.write_text(f"name: {cluster_name}\ncluster_name: {cluster_name}\npartitions: {{debug: {{}}}}\n"
                        "max_array_size: 4\n")
        parts[cluster_name] = [a for _, a, _, _ in build(load(spec, workdir, cluster=str(prof))).scripts]
    assert parts == {"local": ["0-6"], "elsewhere": ["0-2", "0-2", "0-0"]}


@pytest.mark.parametrize("option", [pytest.param("comment", marks=pytest.mark.slurm_release), "wckey"])
def test_an_injection_through_a_passed_option_reaches_slurm_as_one_value(tmp_path, workdir, tiny_corpus, option):
    """A value made to end its #SBATCH argument early and add options of its own (a backslash, a quote, then
    --job-name, --output and --hold) arrives at Slurm whole; the job has the launcher's name and log and runs."""
    stolen = tmp_path / "stolen"
    value = f'\\\' " --job-name=pwned --output={stolen}_%j.out --hold #'
    spec = tmp_path / "inject.yaml"
    spec.write_text(json.dumps({"name": "inject", "train": tiny_train(data_file=str(tiny_corpus), max_steps=5),
                                "resources": {"time": "00:05:00", "sbatch_options": {option: value}}}))
    out = launch(str(spec), "--workdir", str(workdir))
    assert out.returncode == 0, out.stdout + out.stderr

    job = manifest_of(workdir, "inject").task_job_ids()[0]
    assert wait(job) == "COMPLETED"  # never held
    shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=30).stdout
    print(f"\nscontrol show job {job}:\n{shown}")
    fields = {}
    for line in shown.splitlines():  # one field a line where a value may hold spaces (Comment=, WCKey=)
        key, _, rest = line.strip().partition("=")
        fields.setdefault(key, rest)
    assert "JobName=inject" in shown and "pwned" not in shown.replace(value, "")
    assert fields["StdOut"] == str(workdir / "logs" / "inject" / f"{job.split('_')[0]}_0.out")
    assert not list(tmp_path.glob("stolen*"))
    if option == "comment":  # (Slurm keeps a wckey only where accounting tracks them: TrackWCKey)
        assert f"Comment={value}" in shown  # the whole value, as given


def test_a_two_node_job_whose_master_no_node_answers_on_ends_in_its_join_time_with_the_master_named(
        tmp_path, workdir, tiny_corpus):
    """MASTER_ADDR set to an address of the cluster's own subnet that no node has: both ranks give up after
    join_timeout (8 s, of a 5-minute job) naming the master, and `status` shows it as the run's failure."""
    spec = tmp_path / "lost.yaml"
    spec.write_text(json.dumps({"name": "lost", "train": tiny_train(data_file=str(tiny_corpus), max_steps=5,
                                                                   join_timeout=8),
                                "resources": {"nodes": 2, "tasks_per_node": 1, "time": "00:05:00"}}))
    out = launch(str(spec), "--workdir", str(workdir), env={"MASTER_ADDR": "10.77.0.99"})
    assert out.returncode == 0, out.stdout + out.stderr

    job = manifest_of(workdir, "lost").task_job_ids()[0]
    assert wait(job) == "FAILED"
    log = (workdir / "logs" / "lost" / f"{job}.out").read_text()
    for rank in (0, 1):
        assert re.search(f"error: rank {rank} on node{rank + 1}: could not reach the master at 10.77.0.99:[0-9]+ "
                         f"within 8 s", log), log[-3000:]
    assert "Traceback" not in log
    status = launch("status", str(spec), "--workdir", str(workdir)).stdout
    assert "could not reach the master at 10.77.0.99" in status, status
