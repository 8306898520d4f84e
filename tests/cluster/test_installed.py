"""The launcher installed without a checkout around it (pip install ., not -e): the `tinygpt-launch` command and
`python -m tinygpt.launch` from a folder outside the repository, a profile found in the user's own folder, and
jobs that run the installed package's files (its snapshot), on the real local cluster."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT
from tests.support.processes import launch, wait_until
from tests.support.slurm import cancel, manifest_of, unique_name, wait

pytestmark = pytest.mark.slurm


def installed(tmp_path: Path) -> Path:
    """The project as `pip install .` lays it out (a wheel's files, no checkout), in a folder of its own; the
    dependencies are this environment's."""
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                    str(target), str(ROOT)], check=True, timeout=300, capture_output=True)
    return target


@pytest.mark.shares_cluster
def test_the_installed_command_launches_from_outside_the_checkout_with_a_profile_of_the_users(tmp_path):
    """... and says its hints as the user typed it, and its retry heal job runs from the installed package's
    snapshot (its batch script's files too) and writes the summary."""
    target, outside, config = installed(tmp_path), tmp_path / "elsewhere", tmp_path / "config"
    (config / "tinygpt-hpc" / "clusters").mkdir(parents=True)
    shutil.copy(ROOT / "hpc_lab" / "clusters" / "local.yaml", config / "tinygpt-hpc" / "clusters" / "mine.yaml")
    outside.mkdir()
    name = unique_name("installed")
    spec = outside / "sweep.yaml"
    spec.write_text(yaml.safe_dump({"name": name, "cluster": "mine", "resources": {"time": "00:05:00"},
                                    "command": {"argv": ["sh", "-c", "echo installed {run_name}"]},
                                    "retry": {"rounds": 1}}))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(target), XDG_CONFIG_HOME=str(config))
    where = subprocess.run([sys.executable, "-c", "import tinygpt.launch.layout as l; print(l.REPO_ROOT, "
                            "l.CHECKOUT)"], cwd=outside, env=env, capture_output=True, text=True, check=True)
    assert where.stdout.split() == [str(target), "None"]
    helped = subprocess.run([sys.executable, "-m", "tinygpt.launch", "--help"], cwd=outside, env=env,
                            capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "resubmit" in helped.stdout
    out = subprocess.run([str(target / "bin" / "tinygpt-launch"), "sweep.yaml", "--workdir", "work"], cwd=outside,
                         env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0 and "not a git checkout: the package files" in out.stdout, out.stdout + out.stderr
    assert "follow with `tinygpt-launch status sweep.yaml --workdir work`" in out.stdout, out.stdout
    manifest = manifest_of(outside / "work", name)
    job, heal = manifest.task_job_ids()[0], next(s.job_id for s in manifest.submissions if s.role == "heal")
    try:
        assert wait(job) == "COMPLETED" and wait(heal) == "COMPLETED"
    finally:
        cancel(job, heal)
    summary = outside / "work" / "runs" / name / "summary.md"
    assert summary.read_text().startswith(f"# sweep {name}: 1 of 1 run(s) finished"), summary.read_text()
    code = Path(manifest.code["path"])
    assert (code / "tinygpt" / "launch" / "node" / "supervise.py").exists() and not (code / "launch.py").exists()
    log = wait_until(lambda: "".join(p.read_text() for p in (outside / "work" / "logs" / name).glob("*.out")),
                     timeout=30, what="the task's log")
    assert "installed base" in log, log


def test_profile_new_outside_the_checkout_writes_to_the_users_folder_where_cluster_finds_it(tmp_path):
    config = tmp_path / "config"
    out = launch("profile", "new", "--name", "asked", cwd=tmp_path, env={"XDG_CONFIG_HOME": str(config)})
    written = config / "tinygpt-hpc" / "clusters" / "asked.yaml"
    assert out.returncode == 0 and f"wrote {written}" in out.stdout, out.stdout + out.stderr
    assert "yaml-language-server" in written.read_text()  # (this checkout's schema, for an editor)
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "s", "cluster": "asked", "command": {"argv": ["true"]}}))
    dry = launch(str(spec), "--dry-run", "--workdir", str(tmp_path / "w"), cwd=tmp_path,
                 env={"XDG_CONFIG_HOME": str(config)})
    assert dry.returncode == 0 and "cluster asked" in dry.stdout, dry.stdout + dry.stderr
