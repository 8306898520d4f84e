"""`launch.py check SPEC`, and the same check at the start of every submission: the spec against the live
cluster (what Slurm says of its partitions, nodes and the user's accounts), then `sbatch --test-only`."""

from __future__ import annotations

import json
import os
import re
import subprocess
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from tests.support.gpu_cluster import GPU_CLUSTER
from tests.support.paths import ROOT
from tests.support.processes import launch
from tests.support.slurm import manifest_of, queued, sbatch, scontrol_state, slurm_release, wait_until
from tests.support.tiny import tiny_yaml
from tinygpt.launch.slurm import slurm_cli
from tinygpt.launch.spec import sweep as spec_mod
from tinygpt.launch.submit import placement, preflight

LOCAL = yaml.safe_load((ROOT / "hpc_lab" / "clusters" / "local.yaml").read_text())


def spec_with(tmp_path: Path, corpus: Path, name: str, profile: dict | None = None, resources: dict | None = None,
              grid: str = "") -> Path:
    """A spec for the local cluster's Slurm, its cluster profile (local.yaml changed by `profile`) beside it."""
    cluster = tmp_path / f"{name}-profile.yaml"
    cluster.write_text(yaml.safe_dump({**LOCAL, **(profile or {})}))
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(f"name: {name}\ncluster: {cluster}\ntrain: {{data_file: {corpus}, {tiny_yaml(max_steps=5)}}}\n"
                    f"resources: {json.dumps({'time': '00:05:00', **(resources or {})})}\n{grid}")
    return spec


# What the live cluster refuses, and the message that says so: (name, the profile's changes over local.yaml, the
# spec's resources, its grid, the message)
REFUSED = [
    ("stale", {"partitions": {**LOCAL["partitions"], "gpu": {"max_time": "INFINITE"}}}, {"partition": "gpu"}, "",
     "resources.partition (or the profile's default_partition): `gpu` is not a partition of cluster local (it has "
     "debug, low, low-cancel, high, short, last); name one of those"),
    ("limit", {"partitions": {**LOCAL["partitions"], "short": {"max_time": "INFINITE"}}},
     {"partition": "short", "time": "01:00:00"}, "",
     "resources.time: 01:00:00 is over partition short's MaxTime 00:30:00; ask for at most 00:30:00 (a run stopped "
     "at its limit resumes in its next job)"),
    ("gpu-type", {"node": {"gpus": 2, "gpu_type": "v100", "cpus": 2}, "gpu_request": "gres"}, {"gpus_per_node": 1},
     "", "node.gpu_type (profile local): `v100` is not a GPU type on partition debug's nodes (they have a100, h100); "
     "set node.gpu_type to one of those, or choose the partition that has v100"),
    ("gpus", {"node": {"gpus": 4, "gpu_type": "a100", "cpus": 2}, "gpu_request": "gres"},
     {"gpus_per_node": 4, "tasks_per_node": 1}, "",
     "resources.gpus_per_node: 4 is more than a node of partition debug holds (2); ask for at most 2, and more "
     "nodes"),
    # (up.sh --accounts: the user is in account tinygpt, not in elsewhere; QOS capped refuses jobs over 10 minutes)
    ("account", None, {"account": "elsewhere"}, "",
     "resources.account (or the profile's): `elsewhere` is not one of your accounts (root, tinygpt, waves); name one "
     "of those"),
    ("qos", None, {"qos": "capped", "time": "00:20:00"}, "",
     "resources.time: 00:20:00 is over QOS capped's MaxWall 00:10:00; ask for at most 00:10:00, or another QOS "
     "(resources.qos (or the profile's))"),
    ("array", {"cluster_name": None, "max_array_size": 5000}, None, f"grid: {{seed: {list(range(1100))}}}\n",
     "max_array_size (profile local): array.sbatch's task ids reach 1099, and this cluster's MaxArraySize is "
     "1001"),
    ("elsewhere", {"cluster_name": "a100cluster"}, None, "",
     "cluster: profile `local` is for cluster `a100cluster`, and this Slurm is `local`"),
]


@pytest.mark.slurm_release
@pytest.mark.slurm(needs=["gpus", "accounts"])
@pytest.mark.shares_cluster
@pytest.mark.parametrize("name, profile, resources, grid, message", REFUSED, ids=[case[0] for case in REFUSED])
def test_a_spec_the_live_cluster_would_refuse_is_named_and_nothing_is_submitted(tmp_path, tiny_corpus, name,
                                                                                 profile, resources, grid, message):
    spec = spec_with(tmp_path, tiny_corpus, name, profile, resources, grid)
    # `check`, and a plain submission: the same verdict (a launch asked once of each stage: the spec against the
    # cluster before anything is written, and the written scripts' arrays)
    for command in (["check", str(spec)], *([[str(spec)]] if name in ("limit", "array") else [])):
        out = launch(*command, "--workdir", str(tmp_path / "w"))
        assert out.returncode == 1 and message in out.stderr, out.stdout + out.stderr
        assert "Traceback" not in out.stderr
    assert queued(name) == []


def test_the_check_reads_time_limits_gpu_types_and_qos_from_what_slurm_says(tmp_path):
    """A GPU cluster's records (gpu_cluster.GPU_CLUSTER: a100 and h100 partitions, MaxTime 2 days and 4 h),
    which the local cluster cannot show."""
    def problems(resources: dict, profile: dict) -> list[str]:
        cluster = tmp_path / "big.yaml"
        cluster.write_text(yaml.safe_dump({"name": "big", "cluster_name": "big", "partitions": {
            "a100": {"max_time": "2-00:00:00"}, "h100": {"max_time": "4-00:00:00"}}, "gpu_request": "gres",
            **profile}))
        spec = tmp_path / "s.yaml"
        spec.write_text(yaml.safe_dump({"name": "s", "cluster": str(cluster), "resources": resources}))
        return preflight.spec_problems(spec_mod.load(spec, tmp_path), GPU_CLUSTER)

    h100 = {"node": {"gpus": 8, "gpu_type": "h100"}}
    assert problems({"partition": "h100", "time": "08:00:00", "gpus_per_node": 8}, h100) == [
        "resources.time: 08:00:00 is over partition h100's MaxTime 04:00:00; ask for at most 04:00:00 (a run "
        "stopped at its limit resumes in its next job)"]
    assert problems({"partition": "h100", "nodes": 2, "gpus_per_node": 8}, h100) == [
        "resources.nodes: 2 is more than partition h100 gives one job (1); ask for at most 1"]
    assert problems({"partition": "a100", "gpus_per_node": 8}, h100) == [
        "node.gpu_type (profile big): `h100` is not a GPU type on partition a100's nodes (they have a100); set "
        "node.gpu_type to one of those, or choose the partition that has h100"]
    a100 = {"node": {"gpus": 8, "gpu_type": "a100"}}
    assert problems({"partition": "a100", "gpus_per_node": 8, "qos": "long"}, a100) == []  # (one node has 8)
    assert problems({"partition": "a100", "gpus_per_node": 8, "account": "proj2", "qos": "long"}, a100) == [
        "resources.qos (or the profile's): `long` is not a QOS you may use with account proj2 (normal); name one of "
        "those"]
    assert problems({"partition": "staff"}, {"partitions": {"staff": {}}}) == [
        "resources.partition (or the profile's default_partition): partition `staff` is not open to you "
        "(AllowGroups=no-such-group-here: none of your groups); choose another"]


@pytest.mark.slurm
@pytest.mark.shares_cluster
def test_a_submission_fails_closed_when_slurm_cannot_answer_and_no_check_says_it_was_not_checked(tmp_path,
                                                                                                 tiny_corpus):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    real = subprocess.run(["which", "scontrol"], capture_output=True, text=True).stdout.strip()
    # scontrol refuses `show partition` as a controller that times out would; the rest goes to the real one
    (bindir / "scontrol").write_text(f'#!/bin/bash\nif [ "$3" = partition ]; then echo "slurm_load_partitions '
                                     f'error: Socket timed out" >&2; exit 1; fi\nexec {real} "$@"\n')
    (bindir / "scontrol").chmod(0o755)
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    spec, work = spec_with(tmp_path, tiny_corpus, "blind"), tmp_path / "w"
    out = launch(str(spec), "--workdir", str(work), env=env)
    assert out.returncode == 1 and preflight.NOT_CHECKED in out.stderr, out.stdout + out.stderr
    assert queued("blind") == [] and not (work / "jobs").exists()
    held = launch(str(spec), "--workdir", str(work), "--no-check", "--hold", env=env)
    assert held.returncode == 0 and "not checked against the live cluster (--no-check)" in held.stdout, held.stderr
    job = manifest_of(work, "blind").submissions[0].job_id
    subprocess.run(["scancel", job], check=True, timeout=30)


@pytest.mark.slurm_release
@pytest.mark.slurm
def test_placement_takes_the_way_slurm_starts_first_and_status_shows_when_a_pending_run_starts(tmp_path,
                                                                                               tiny_corpus):
    # Partition `last` (node2 alone) taken for ten minutes at most: a job there waits, and Slurm can say until when
    jobs = [sbatch("--partition=last", "--exclusive", "--time=00:10:00", "--output=/dev/null",
                   script="#!/bin/bash\nsleep 600\n")]
    try:
        wait_until(lambda: scontrol_state(jobs[0]) == "RUNNING", timeout=60, what="the job filling partition last")
        stale = {"partitions": {**LOCAL["partitions"], "gpu": {"max_time": "INFINITE"}}}  # (not this cluster's)
        ways = "placement: {soonest: [{partition: last}, {partition: gpu}, {partition: debug}]}\n"
        placed = launch("check", str(spec_with(tmp_path, tiny_corpus, "placed", stale, grid=ways)), "--json",
                        "--workdir", str(tmp_path / "w"))
        said = json.loads(placed.stdout)["said"]
        estimates = {line.split(": ")[2]: line for line in said if line.startswith("placement: partition: ")}
        assert "would start at " in estimates["last"] and "in partition last" in estimates["last"], said
        assert estimates["gpu"].startswith("placement: partition: gpu: not on this cluster: resources.partition")
        assert "would start at " in estimates["debug"] and "in partition debug" in estimates["debug"], said
        assert _start(estimates["debug"]) < _start(estimates["last"])  # (node1 is free now)
        assert "placement: chose partition: debug, as it would start first" in said, said
        assert any("slurm: placed.sbatch: would start at " in line and "in partition debug" in line for line in said)
        release = slurm_release()  # (of the commands on PATH, which are the controller's release here)
        assert said[-1] == f"check: the spec fits cluster local (Slurm {release}); nothing submitted", said
        assert queued("placed") == []

        spec, work = spec_with(tmp_path, tiny_corpus, "later", resources={"partition": "last"}), tmp_path / "w"
        assert launch(str(spec), "--workdir", str(work)).returncode == 0
        jobs.append(manifest_of(work, "later").task_job_ids()[0])

        def estimated() -> str | None:
            out = launch("status", str(spec), "--workdir", str(work)).stdout
            return next((line for line in out.splitlines() if "PENDING" in line and "starts 20" in line), None)

        row = wait_until(estimated, timeout=60, poll=0.5, what="status showing the pending run's estimated start")
        assert jobs[1] in row
    finally:
        subprocess.run(["scancel", *jobs], timeout=30)


def _start(estimate: str) -> datetime:
    return datetime.fromisoformat(estimate.split("would start at ")[1].split()[0])


def test_placement_keeps_the_specs_first_way_on_a_tie_or_where_slurm_gives_no_time(tmp_path, monkeypatch, capsys):
    """What Slurm says of each way stubbed: a cluster gives no time on demand (a held or dependent job gets none)."""
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nresources: {time: '00:20:00'}\nplacement: {soonest: [{partition: short}, "
                    "{partition: debug, time: '00:15:00'}, {partition: high}]}\n")
    sweep = spec_mod.load(spec, tmp_path)
    assert [way.said for way in sweep.placement] == ["partition: short", "time: 00:15:00, partition: debug",
                                                     "partition: high"]
    assert sweep.resources == sweep.placement[0].resources  # (the spec's choice until a live check takes one)

    def answers(words: dict[str, str]) -> None:
        def test_only(path: str, extra=None) -> tuple[bool, str]:
            partition = re.search(r"--partition=(\S+)", Path(path).read_text())[1]
            return not words[partition].startswith("error"), words[partition]
        monkeypatch.setattr(slurm_cli, "sbatch_test_only", test_only)

    at = "would start at {} using 1 processors on nodes node1 in partition {}"  # (as sbatch_test_only words it)
    answers({"short": "error: Batch job submission failed: Invalid qos specification",
             "debug": at.format("2026-12-06T10:00:00", "debug"), "high": at.format("2026-12-06T10:00:00", "high")})
    assert placement.soonest(sweep, {}) == sweep.placement[1].resources  # (the tie: the spec's order)
    said = capsys.readouterr().out
    assert "placement: partition: short: Slurm would not take it: error: Batch job" in said
    assert "placement: chose time: 00:15:00, partition: debug, as the spec lists it first of those that would " \
           "start first" in said
    answers({"short": "would start at Unknown", "debug": at.format("2026-12-06T09:00:00", "debug"),
             "high": at.format("2026-12-06T10:00:00", "high")})
    assert placement.soonest(sweep, {2: "why not"}) == sweep.placement[0].resources
    said = capsys.readouterr().out
    assert "placement: partition: high: not on this cluster: why not" in said
    assert ("placement: chose partition: short, as the first of the spec's ways that Slurm would take (it gave no "
            "start time for partition: short, so the ways cannot be compared)") in said
