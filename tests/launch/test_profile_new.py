"""`launch.py profile new`: a cluster profile written from what the reachable Slurm says, checked, found, used."""

from __future__ import annotations

import json
import subprocess

import jsonschema
import pytest
import yaml

from tests.support.gpu_cluster import GPU_CLUSTER
from tests.support.hermetic import slurm_that_records
from tests.support.paths import ROOT
from tests.support.processes import launch
from tests.support.slurm import manifest_of, wait
from tests.support.sweeps import sweep_dirs
from tests.support.tiny import tiny_yaml
from tinygpt.launch import api, profile_new
from tinygpt.launch.commands import json_schema
from tinygpt.launch.spec import profiles


def live(kind: str) -> list[dict[str, str]]:
    from tinygpt.launch.slurm import slurm_cli

    return slurm_cli.scontrol_records(kind)


@pytest.mark.slurm_release
@pytest.mark.slurm(needs=["gpus", "accounts"])
@pytest.mark.shares_cluster
def test_profile_new_writes_what_slurm_says_and_sweeps_run_with_it_unchanged(tmp_path, tiny_corpus):
    out = launch("profile", "new", "--dir", str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    path = tmp_path / "local.yaml"
    text = path.read_text()
    written = yaml.safe_load(text)
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30).stdout
    cluster = next(line.split("=", 1)[1].strip() for line in config.splitlines() if line.startswith("ClusterName"))
    partitions = {p["PartitionName"]: p for p in live("partition")}
    node1 = next(n for n in live("node") if n["NodeName"] == "node1")
    assert written["cluster_name"] == cluster and list(written["partitions"]) == list(partitions)
    assert written["default_partition"] == next(n for n, p in partitions.items() if p["Default"] == "YES")
    assert written["partitions"] == {n: {"max_time": "INFINITE" if p["MaxTime"] == "UNLIMITED" else p["MaxTime"],
                                         "max_nodes": int(p["TotalNodes"])} for n, p in partitions.items()}
    assert written["partitions"]["short"]["max_time"] == "00:30:00"  # (the local cluster's partition with a limit)
    # The default partition's nodes differ (up.sh --gpus 2:a100,2:h100): the first kind is the profile's node, the
    # other is said beside each partition.
    assert written["node"] == {"gpus": 2, "gpu_type": "a100", "cpus": int(node1["CPUTot"]),
                               "mem": f"{node1['RealMemory']}M"}
    assert f"# 2 node(s); 1 x 2 x h100, {node1['CPUTot']} CPUs, {node1['RealMemory']}M" in text
    assert written["gpu_request"] == "gres" and written["max_array_size"] == 1001
    # The user's account and QOS (up.sh --accounts), and what limits the others
    assert (written["account"], written["qos"]) == ("tinygpt", "normal")
    assert "# your default QOS (allowed: capped (MaxWall 00:10:00), normal, waves)" in text
    assert "# queue limits on your jobs: none (a launch reads them anew" in text
    assert "# preemption: preempt/partition_prio, mode REQUEUE" in text and "low-cancel CANCEL" in text
    assert text.count("# a guess") == 2 and "# modules:" in text and "# setup:" in text
    # It passes the profile schema (the loader's and the editors' JSON Schema), and is used as it is.
    assert profiles.from_file(path).cluster_name == cluster
    jsonschema.Draft202012Validator(json.loads(json_schema.path("profile").read_text())).validate(written)

    work = tmp_path / "w"
    for name, resources in (("cpu", "{time: '00:05:00'}"), ("gpu", "{time: '00:05:00', gpus_per_node: 1}")):
        spec = tmp_path / f"{name}.yaml"
        spec.write_text(f"name: {name}\ntrain: {{data_file: {tiny_corpus}, {tiny_yaml(max_steps=10, eval_interval=5)}}}"
                        f"\nresources: {resources}\n")
        submitted = launch(str(spec), "--cluster", str(path), "--workdir", str(work))
        assert submitted.returncode == 0 and "cluster local" in submitted.stdout, submitted.stdout + submitted.stderr
    for name in ("cpu", "gpu"):  # (both submitted first: they train side by side)
        assert wait(manifest_of(work, name).task_job_ids()[0]) == "COMPLETED", name
    assert "#SBATCH --gres=gpu:a100:1" in sweep_dirs(work, "gpu").script().read_text()


@pytest.mark.slurm
@pytest.mark.shares_cluster
def test_profile_new_never_writes_over_a_profile_without_force(tmp_path):
    assert launch("profile", "new", "--dir", str(tmp_path), "--name", "mine").returncode == 0
    path = tmp_path / "mine.yaml"
    path.write_text(path.read_text() + "# a line of the user's own\n")
    before = path.read_bytes()
    again = launch("profile", "new", "--dir", str(tmp_path), "--name", "mine")
    assert again.returncode == 1 and f"{path} exists; nothing was written" in again.stderr
    assert path.read_bytes() == before
    shipped = ROOT / "hpc_lab" / "clusters" / "local.yaml"
    kept = shipped.read_bytes()
    into_the_repo = launch("profile", "new")  # (the local cluster's ClusterName: the shipped local.yaml)
    assert into_the_repo.returncode == 1 and "local.yaml exists" in into_the_repo.stderr
    assert shipped.read_bytes() == kept
    forced = launch("profile", "new", "--dir", str(tmp_path), "--name", "mine", "--force")
    assert forced.returncode == 0 and "a line of the user's own" not in path.read_text()
    by_command = path.read_text()
    with pytest.raises(api.LaunchError, match="mine.yaml exists; nothing was written"):
        api.new_profile(tmp_path, name="mine")  # (the library's call: the same checks, the same file)
    assert api.new_profile(tmp_path, name="mine", force=True) == path and path.read_text() == by_command
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.yaml"]  # (no draft left behind)


def test_profile_new_without_a_slurm_writes_nothing(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text("#!/bin/bash\necho 'slurm_load_ctl_conf error: Unable to contact slurm "
                                     "controller' >&2\nexit 1\n")
    (bindir / "scontrol").chmod(0o755)
    import os

    out = launch("profile", "new", "--dir", str(tmp_path / "out"),
                 env={"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"})
    # A controller that does not answer: said at once, with the status that says "try again"
    assert out.returncode == 75 and "the Slurm controller (slurmctld) does not answer" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "out").exists()
    nothing = launch("profile", "new", "--dir", str(tmp_path / "out"))  # (no Slurm commands on this machine)
    assert nothing.returncode == 1 and "no Slurm commands on this machine" in nothing.stderr, nothing.stderr
    assert not (tmp_path / "out").exists()
    # Its own flags are checked first: a mistake in them is said without asking Slurm anything.
    recording, asked = slurm_that_records(tmp_path)
    bad = launch("profile", "new", "--name", "../elsewhere", "--dir", str(tmp_path / "out"), env=recording)
    assert bad.returncode == 1 and "--name: '../elsewhere' is not a profile name" in bad.stderr
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.yaml").write_text("name: mine\n")
    taken = launch("profile", "new", "--name", "mine", "--dir", str(tmp_path / "out"), env=recording)
    assert taken.returncode == 1 and "mine.yaml exists; nothing was written" in taken.stderr
    assert not asked.exists(), asked.read_text()


def test_profile_of_a_gpu_cluster_names_its_gpu_types_and_what_differs(tmp_path):
    text = profile_new.render("big", GPU_CLUSTER)
    path = tmp_path / "big.yaml"
    path.write_text(text)
    profile = profiles.from_file(path)
    assert (profile.account, profile.qos, profile.default_partition, profile.max_array_size) == (
        "proj1", "normal", "a100", 5001)
    assert {n: (p.max_time, p.max_nodes) for n, p in profile.partitions.items()} == {
        "a100": (2 * 24 * 60, 3), "h100": (4 * 60, 1)}  # (minutes)
    assert (profile.node.gpus, profile.node.gpu_type, profile.node.cpus, profile.gpu_request) == (4, "a100", 64, "gres")
    assert "1 x 8 x a100, 128 CPUs, 1024000M" in text and "2 x 8 x h100, 96 CPUs, 768000M" in text
    assert "not here: staff (AllowGroups=no-such-group-here" in text and "not here: old (State=DOWN)" in text
    assert "(allowed: long, normal)" in text
