"""Efficiency from sacct: parsing Slurm's fields, and a sweep's figures on the local cluster."""


import pytest

from tests.support.processes import launch as shared_launch
from tests.support.processes import slow_saves
from tests.support.slurm import counting_shim, manifest_of, wait
from tests.support.tiny import tiny_yaml
from tinygpt.launch.read import efficiency
from tinygpt.launch.spec import resources

SACCT = """\
7_0|COMPLETED|100|03:20.000|4|16G||billing=4,cpu=4,gres/gpu=1,mem=16G,node=1|||1
7_0.batch|COMPLETED|100|00:00.500|4||12M|cpu=4,mem=16G,node=1|cpu=00:00:00,mem=12M|cpu=00:00:00,mem=12M|1
7_0.0|COMPLETED|99|03:19.500|4||3.5G|cpu=4,gres/gpu=1,mem=16G,node=1|cpu=00:03:19,gres/gpumem=20000M,\
gres/gpuutil=23,mem=3G|cpu=00:03:19,gres/gpumem=30000M,gres/gpuutil=95,mem=3.5G|1
7_1|FAILED|3600|1-00:00:00|2|4000Mc||billing=2,cpu=2,mem=8000M,node=1|||1
7_1.0|FAILED|3600|23:59:00|2||512000K|cpu=2,mem=8000M,node=1|||1
7_2|PENDING|0|00:00:00|0|16G|||||1
"""


def test_sacct_fields_become_efficiency_figures():
    usage = efficiency.parse(SACCT)
    gpu = usage["7_0"]
    assert (gpu.elapsed_s, gpu.cpus, gpu.cpu_s, gpu.gpus) == (100, 4, 200.0, 1)
    assert gpu.cpu_eff == pytest.approx(0.5) and gpu.peak_mem_mb == pytest.approx(3.5 * 1024)
    assert gpu.mem_eff == pytest.approx(3.5 / 16) and gpu.gpu_util == 23 and gpu.gpu_mem_mb == 30000
    assert gpu.idle  # a GPU job is judged by its GPU: 23% used
    cpu = usage["7_1"]
    assert cpu.req_mem_mb == 8000 and cpu.cpu_s == 86400 and cpu.cpu_eff == pytest.approx(12.0)  # (CPU time of
    assert not cpu.idle and cpu.peak_mem_mb == 500  # every child; Slurm adds them up), old per-CPU ReqMem
    assert usage["7_2"].cpu_eff is None and not usage["7_2"].idle
    assert efficiency.cells(gpu)["flag"].startswith("IDLE") and efficiency.cells(None)["elapsed"] == "-"
    assert resources.duration_s("1-02:03:04.5") == 93784.5 and resources.duration_s("") == 0


@pytest.fixture
def sacct_counter(tmp_path):
    return counting_shim(tmp_path, "sacct")


@pytest.mark.slurm_release
@pytest.mark.slurm
@pytest.mark.alone  # a busy CPU must read as busy: no other test's processes on the cores
def test_efficiency_of_a_busy_and_a_half_idle_allocation(tmp_path, tiny_corpus, sacct_counter):
    env, count = sacct_counter
    work = tmp_path / "w"
    train = tiny_yaml(max_steps=600, eval_interval=300, data_file=str(tiny_corpus))
    specs = {}
    for name, cpus in (("busy", 1), ("idle", 2)):  # one trainer thread on one CPU, and on two
        specs[name] = tmp_path / f"{name}.yaml"
        specs[name].write_text(f"name: {name}\ntrain: {{{train}, ckpt_interval: 20}}\nresources: {{time: '00:10:00', "
                               f"mem: 1G, cpus_per_task: {cpus}, sbatch_options: {{acctg-freq: 1}}}}\n")

    def launch(*args, **extra):
        return shared_launch(*args, "--workdir", str(work), env={**env, **extra})

    # The busy one first, to its end: beside the other, on a machine of two cores, it would share a core.
    assert launch(str(specs["busy"])).returncode == 0
    assert wait(f"{manifest_of(work, 'busy').submissions[0].job_id}_0") == "COMPLETED"
    # The idle one also waits most of its time (its checkpoint writes slowed, as on a slow filesystem; the job
    # inherits this environment), on two CPUs where it can use one.
    assert launch(str(specs["idle"]), **slow_saves(0.3)).returncode == 0
    assert wait(f"{manifest_of(work, 'idle').submissions[0].job_id}_0") == "COMPLETED"
    count.unlink(missing_ok=True)
    shown = {name: launch("status", str(spec), "--efficiency") for name, spec in specs.items()}
    assert len(count.read_text().splitlines()) == 2  # one sacct call per sweep
    rows = {}
    for name, out in shown.items():
        assert out.returncode == 0, out.stderr
        line = next(line for line in out.stdout.splitlines() if "│ base " in line)
        rows[name] = [cell.strip() for cell in line.strip("│").split("│")]
    busy, idle = rows["busy"], rows["idle"]
    busy_eff, idle_eff = int(busy[5].rstrip("%")), int(idle[5].rstrip("%"))
    assert busy[4] == "1" and busy_eff >= 70 and busy[-1] == "", busy  # one busy thread on its one CPU
    assert idle[4] == "2" and idle_eff < 40 and idle[-1].startswith("IDLE"), idle
    assert busy[6].endswith("/ 1,024 MB" + busy[6].split("MB")[-1]) and "MB /" in busy[6]  # peak / asked
    report = launch("report", str(specs["idle"]))
    assert report.returncode == 0, report.stderr
    text = (work / "runs" / "idle" / "report.md").read_text()
    assert "## Efficiency (sacct)" in text and "IDLE: most of the allocation unused" in text
