"""The local Slurm cluster answers like a real one (it is one): sbatch, srun, multi-node, sacct, training."""

import pytest

from tests.support.slurm import cancel, job_env, python, sbatch, unique_name, wait, wait_sacct
from tests.support.tiny import TINY_FLAGS, read_metrics

# (each: the release itself, on every release)
pytestmark = [pytest.mark.slurm, pytest.mark.slurm_release, pytest.mark.shares_cluster]


@pytest.fixture
def jobs():
    submitted: list[str] = []
    yield submitted
    cancel(*submitted)


def test_wrap_job_completes_and_sacct_reports_it(tmp_path, jobs):
    name = unique_name("wrap")
    job = sbatch("-J", name, "-o", str(tmp_path / "out.txt"), "--wrap", "echo hello from $SLURM_JOB_ID")
    jobs.append(job)
    assert wait(job) == "COMPLETED"
    assert (tmp_path / "out.txt").read_text().strip() == f"hello from {job}"
    assert wait_sacct(job, "COMPLETED") == "COMPLETED"


def test_two_tasks_see_their_procid(tmp_path, jobs):
    script = "#!/bin/bash\nsrun bash -c 'echo task $SLURM_PROCID of $SLURM_NTASKS'\n"
    job = sbatch("-J", unique_name("ntasks"), "-n", "2", "-o", str(tmp_path / "out.txt"), script=script)
    jobs.append(job)
    assert wait(job) == "COMPLETED"
    lines = sorted((tmp_path / "out.txt").read_text().split("\n"))
    assert [line for line in lines if line] == ["task 0 of 2", "task 1 of 2"]


def test_two_nodes_have_their_own_hostnames_and_talk_over_tcp(tmp_path, jobs):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import os, socket, subprocess, time\n"
        "rank = int(os.environ['SLURM_PROCID'])\n"
        "first = subprocess.run(['scontrol', 'show', 'hostnames', os.environ['SLURM_JOB_NODELIST']],\n"
        "                       capture_output=True, text=True).stdout.split()[0]\n"
        "port = 20000 + int(os.environ['SLURM_JOB_ID']) % 20000\n"
        "me = socket.gethostname()\n"
        "if rank == 0:\n"
        "    s = socket.create_server(('0.0.0.0', port)); s.settimeout(60)\n"
        "    conn, addr = s.accept(); peer = conn.recv(100).decode()\n"
        "    conn.sendall(me.encode()); print(f'rank0 on {me} heard from {peer}', flush=True)\n"
        "else:\n"
        "    for _ in range(120):\n"
        "        try:\n"
        "            c = socket.create_connection((first, port), timeout=5); break\n"
        "        except OSError:\n"
        "            time.sleep(0.5)\n"
        "    c.sendall(me.encode()); print(f'rank1 on {me} reached {c.recv(100).decode()}', flush=True)\n"
    )
    script = f"#!/bin/bash\nsrun {python()} {probe}\n"
    job = sbatch("-J", unique_name("nodes"), "-N", "2", "--ntasks-per-node", "1", "-o", str(tmp_path / "out.txt"),
                 script=script)
    jobs.append(job)
    assert wait(job) == "COMPLETED", (tmp_path / "out.txt").read_text()
    out = (tmp_path / "out.txt").read_text()
    rank0 = next(line for line in out.splitlines() if line.startswith("rank0"))
    rank1 = next(line for line in out.splitlines() if line.startswith("rank1"))
    host0, heard = rank0.split()[2], rank0.split()[-1]
    host1, reached = rank1.split()[2], rank1.split()[-1]
    assert host0 != host1
    assert heard == host1 and reached == host0


def test_training_job_under_srun_writes_metrics(tmp_path, jobs, tiny_corpus):
    run_dir = tmp_path / "run"
    flags = " ".join([*TINY_FLAGS, "--data-file", str(tiny_corpus), "--out-dir", str(run_dir),
                      "--data-dir", str(tmp_path / "data")])
    script = f"#!/bin/bash\nsrun {python()} -m tinygpt.train {flags}\n"
    job = sbatch("-J", unique_name("train"), "-n", "1", "-o", str(tmp_path / "out.txt"), script=script,
                 env=job_env())
    jobs.append(job)
    assert wait(job) == "COMPLETED", (tmp_path / "out.txt").read_text()
    records = read_metrics(run_dir)
    assert records[-1]["event"] == "finished" and records[-1]["step"] == 20
    assert any("val_loss" in r for r in records)
    assert "done: step 20" in (tmp_path / "out.txt").read_text()
