"""GPU requests scheduled by a real Slurm: the local cluster's stand-in GPUs (`up.sh --gpus 2:a100,2:h100`: node1
has two a100, node2 two h100; Slurm allocates, accounts for and hands them out, and no device exists, so the
trainers run on CPU). The A100 and H100 example profiles' GPU requests, as they are, on this cluster."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT
from tests.support.processes import launch
from tests.support.slurm import manifest_of, slurm_release, step_cpus, wait, wait_sacct
from tests.support.tiny import read_metrics, tiny_train
from tinygpt.training.packing import gpu_share, take_pack_share

EXAMPLES = ROOT / "hpc_lab" / "clusters"


def on_this_cluster(example: str, tmp_path: Path) -> Path:
    """The example profile with what is its site's own (cluster name, account, partitions, node sizes, software,
    container) made this cluster's; its GPU request (gpu_request, node.gpu_type) is kept as it is."""
    data = yaml.safe_load((EXAMPLES / f"{example}.yaml").read_text())
    for key in ("account", "qos", "container", "python", "modules", "setup"):
        data.pop(key, None)
    data.update(name=f"{example}-here", cluster_name="local", partitions={"debug": {"max_time": "INFINITE"}},
                default_partition="debug", cpus_per_gpu=1, mem_per_gpu="512M", signal_lead_s=30)
    data["node"].update(gpus=2, cpus=2, mem="4G")
    path = tmp_path / f"{example}-here.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def sweep(tmp_path: Path, corpus: Path, name: str, profile: Path, runs: int = 1, **extra) -> tuple[Path, Path]:
    """Launch a sweep of `runs` tiny runs asking for two GPUs a task; its spec and workdir."""
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump({
        "name": name, "cluster": str(profile), "grid": {"seed": list(range(1, runs + 1))},
        "train": tiny_train(data_file=str(corpus), max_steps=10, eval_interval=10),
        "resources": {"time": "00:05:00", "gpus_per_node": 2, **extra.pop("resources", {})}, **extra}))
    work = tmp_path / "w"
    out = launch(str(spec), "--workdir", str(work))
    assert out.returncode == 0, out.stdout + out.stderr
    return spec, work


def started(run_dir: Path) -> dict:
    return json.loads((run_dir / "provenance.json").read_text())["starts"][-1]


@pytest.mark.slurm(needs=["gpus"])
@pytest.mark.shares_cluster
@pytest.mark.parametrize("example, directive, node", [("a100-example", "#SBATCH --gres=gpu:a100:2", "node1"),
                                                      ("h100-example", "#SBATCH --gpus-per-node=2", None)])
@pytest.mark.slurm_release
def test_an_example_profiles_gpu_request_is_scheduled_given_and_accounted(tmp_path, tiny_corpus, example,
                                                                          directive, node):
    spec, work = sweep(tmp_path, tiny_corpus, example.split("-")[0], on_this_cluster(example, tmp_path))
    manifest = manifest_of(work, spec.stem)
    assert directive in Path(manifest.submissions[0].script).read_text()
    job = manifest.task_job_ids()[0]
    assert wait(job) == "COMPLETED"
    start = started(Path(manifest.runs[0].out_dir))
    # What Slurm handed the trainer: two GPUs (of node1's type a100 where the profile says so), as a count and as
    # device indices.
    assert start["slurm"]["SLURM_GPUS_ON_NODE"] == "2" and start["cuda_visible_devices"] == "0,1", start
    assert start["device"] == "cpu" and start["slurm"]["SLURM_JOB_NODELIST"] == (node or start["hostnames"][0])
    log = next((work / "logs" / spec.stem).glob("*.out")).read_text()
    assert "GPUs/node: 2" in log
    # Accounting recorded them, and `status --efficiency` reads them from there.
    wait_sacct(job, "COMPLETED")
    status = launch("status", str(spec), "--efficiency", "--workdir", str(work))
    assert status.returncode == 0, status.stdout + status.stderr
    lines = status.stdout.splitlines()
    header = next(line for line in lines if "┃ GPUs ┃" in line)
    row = next(line for line in lines if "COMPLETED" in line and "│" in line)
    cells = dict(zip(cell_texts(header), cell_texts(row)))
    assert cells["GPUs"] == "2", cells


def cell_texts(line: str) -> list[str]:
    return [cell.strip() for cell in re.split("[│┃]", line.strip())[1:-1]]


@pytest.mark.slurm(needs=["gpus"])
@pytest.mark.shares_cluster
@pytest.mark.slurm_release
def test_packed_runs_each_take_their_share_of_the_tasks_gpus_and_cpus(tmp_path, tiny_corpus):
    """Slurm gives every packed run (an overlapping step) both GPUs of the task; each takes one. Each step holds
    its half of the task's CPUs, as srun's line says on every release, and its trainer is told so."""
    spec, work = sweep(tmp_path, tiny_corpus, "packed", on_this_cluster("a100-example", tmp_path), runs=2, pack=2,
                       resources={"tasks_per_node": 1, "cpus_per_task": 2})
    manifest = manifest_of(work, spec.stem)
    assert wait(manifest.task_job_ids()[0]) == "COMPLETED"
    shares = [started(Path(run.out_dir))["cuda_visible_devices"] for run in manifest.runs]
    assert shares == ["0", "1"]
    for run in manifest.runs:
        assert [rank["cpus_per_task"] for rank in read_metrics(Path(run.out_dir))[0]["cpus"]] == [1]
        assert started(Path(run.out_dir))["slurm_release"].split()[-1] == slurm_release()  # (the node's)
    assert step_cpus(manifest.task_job_ids()[0], 2) == {"0": 1, "1": 1}
    sacct = subprocess.run(["sacct", "-n", "-P", "-X", "-j", manifest.task_job_ids()[0], "-o", "AllocTRES"],
                           capture_output=True, text=True, timeout=30).stdout
    assert "gres/gpu=2" in sacct, sacct


def test_a_packed_runs_share_of_the_gpus():
    eight = [str(i) for i in range(8)]
    assert [gpu_share(eight, j, 4) for j in range(4)] == [["0", "1"], ["2", "3"], ["4", "5"], ["6", "7"]]
    assert [gpu_share(["0", "1"], j, 4) for j in range(4)] == [["0"], ["0"], ["1"], ["1"]]
    assert [gpu_share(["0", "1", "2"], j, 2) for j in range(2)] == [["0"], ["1", "2"]]
    assert gpu_share([], 0, 2) == []
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7", "TINYGPT_PACK_SLOT": "1/2"}
    take_pack_share(env)
    assert env["CUDA_VISIBLE_DEVICES"] == "6,7"
    for untouched in ({"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "0,1", "TINYGPT_PACK_SLOT": "2/2"},
                      {"TINYGPT_PACK_SLOT": "0/2"}):
        before = dict(untouched)
        take_pack_share(untouched)
        assert untouched == before
