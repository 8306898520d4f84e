"""Code snapshots: queued jobs run the code they were submitted with, not what the checkout holds later."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tests.support.slurm import job_env, manifest_of, wait
from tests.support.sweeps import sweep_dirs
from tests.support.tiny import read_metrics, tiny_yaml
from tinygpt.launch.submit import snapshot

TINY_TRAIN = tiny_yaml(max_steps=10, eval_interval=5)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A clone of this repository's HEAD, to edit freely."""
    repo = tmp_path / "checkout"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "test")
    return repo


def test_a_snapshot_holds_the_tracked_files_as_they_are_and_is_reused(checkout, tmp_path):
    dest = tmp_path / "code"
    clean = snapshot.take(checkout, dest)
    assert clean.dirty is False and clean.commit == git(checkout, "rev-parse", "HEAD").strip() and not clean.reused
    assert sorted(str(p.relative_to(clean.path)) for p in clean.path.rglob("*") if p.is_file() or p.is_symlink()) == \
        sorted([*git(checkout, "ls-files").split(), snapshot.RECORD])
    assert snapshot.take(checkout, dest) == snapshot.Snapshot(**{**clean.__dict__, "reused": True})

    trainer = checkout / "tinygpt" / "training" / "trainer.py"
    trainer.write_text(trainer.read_text() + "\n# an uncommitted change\n")
    (checkout / "scratch.py").write_text("print('untracked')\n")
    dirty = snapshot.take(checkout, dest)
    assert dirty.dirty is True and dirty.digest != clean.digest and dirty.untracked == ("scratch.py",)
    assert (dirty.path / "tinygpt" / "training" / "trainer.py").read_text().endswith("# an uncommitted change\n")
    assert not (dirty.path / "scratch.py").exists()
    assert (dirty.path / "hpc_lab" / "04_tinygpt" / "train.sbatch").stat().st_mode & 0o111  # executable bit kept
    assert (dirty.path / "hpc_lab" / "04_tinygpt" / "logs").readlink() == Path("../../logs")  # a link stays one
    record = json.loads((dirty.path / snapshot.RECORD).read_text())
    assert record["digest"] == dirty.digest and record["dirty"] is True and record["commit"] == clean.commit
    assert (clean.path / "tinygpt" / "training" / "trainer.py").read_text() == \
        git(checkout, "show", "HEAD:tinygpt/training/trainer.py")


def test_a_checkout_without_git_snapshots_the_package(tmp_path):
    plain = tmp_path / "plain"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(plain)], check=True)
    subprocess.run(["rm", "-rf", str(plain / ".git")], check=True)
    snap = snapshot.take(plain, tmp_path / "code")
    assert snap.commit is None and snap.dirty is None
    copied = {str(p.relative_to(snap.path)) for p in snap.path.rglob("*") if p.is_file()}
    assert {"launch.py", "pyproject.toml", "tinygpt/training/trainer.py", "tinygpt/launch/commands/cli.py",
            "tinygpt/launch/submit/step.sh"} <= copied  # (the package's files, not only its *.py)
    assert not any(name.startswith(("tests/", "docs/")) for name in copied)


def dry_run(checkout: Path, spec: Path, workdir: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(checkout / "launch.py"), str(spec), "--workdir", str(workdir),
                           *extra], capture_output=True, text=True, env=job_env(COLUMNS="200"), timeout=120)


def test_the_scripts_and_manifest_point_at_the_snapshot(checkout, tmp_path):
    spec = tmp_path / "snap.yaml"
    spec.write_text("name: snap\ntrain: {max_steps: 5}\n")
    out = dry_run(checkout, spec, tmp_path / "w", "--dry-run")
    assert out.returncode == 0, out.stderr
    manifest = json.loads(sweep_dirs(tmp_path / "w", "snap").manifest.read_text())
    code = manifest["code"]
    assert Path(code["path"]).parent == sweep_dirs(tmp_path / "w", "snap").code and code["dirty"] is False
    assert f"code: snapshot {code['snapshot']} of {code['commit'][:10]}, " in out.stdout
    script = sweep_dirs(tmp_path / "w", "snap").script().read_text()
    assert f"export PYTHONPATH={code['path']}" in script and str(checkout) not in script
    live = dry_run(checkout, spec, tmp_path / "w2", "--dry-run", "--no-snapshot")
    assert "code: the live checkout" in live.stdout
    script = sweep_dirs(tmp_path / "w2", "snap").script().read_text()
    assert f"export PYTHONPATH={checkout}" + "${PYTHONPATH" in script


@pytest.mark.slurm
@pytest.mark.shares_cluster
@pytest.mark.parametrize("backend", ["sbatch", "submitit"])
def test_a_queued_job_runs_the_code_it_was_submitted_with(checkout, tmp_path, tiny_corpus, backend):
    """Submit held, break the trainer in the checkout, release: the job trains with the submitted code."""
    work = tmp_path / "w"
    spec = tmp_path / "held.yaml"
    spec.write_text(f"name: held\nbackend: {backend}\ntrain: {{data_file: {tiny_corpus}, {TINY_TRAIN}}}\n"
                    "resources: {time: '00:05:00'}\n")
    hold = ["--hold"] if backend == "sbatch" else []
    out = dry_run(checkout, spec, work, *hold)
    assert out.returncode == 0, out.stdout + out.stderr
    manifest = manifest_of(work, "held")
    job = manifest.submissions[0].job_id
    trainer = checkout / "tinygpt" / "training" / "trainer.py"
    trainer.write_text('raise SystemExit("the edited checkout ran")\n' + trainer.read_text())
    if hold:
        subprocess.run(["scontrol", "release", job], check=True)

    assert wait(manifest_of(work, "held").task_job_ids()[0]) == "COMPLETED"
    run_dir = Path(manifest_of(work, "held").runs[0].out_dir)  # (the file leaves the usual out_dir out)
    assert read_metrics(run_dir)[-1]["event"] == "finished"
    start = json.loads((run_dir / "provenance.json").read_text())["starts"][0]
    assert start["git"]["snapshot"] == manifest.code["snapshot"] and start["git"]["dirty"] is False
    assert start["git"]["commit"] == git(checkout, "rev-parse", "HEAD").strip()
    logs = "".join(p.read_text() for p in (work / "logs" / "held").rglob("*") if p.suffix in (".out", ".err"))
    assert "the edited checkout ran" not in logs


def test_a_snapshot_holds_only_what_is_inside_the_repository_and_shares_unchanged_files(checkout, tmp_path):
    dest = tmp_path / "code"
    outside = tmp_path / "outside.py"
    outside.write_text("VALUE = 1\n")
    (checkout / "outside_link.py").symlink_to(outside)  # a link out of the repository, to a file
    (checkout / "inside_abs").symlink_to(checkout / "tinygpt")  # an absolute link into the repository
    git(checkout, "add", "outside_link.py", "inside_abs")
    first = snapshot.take(checkout, dest)
    copied = first.path / "outside_link.py"
    assert not copied.is_symlink() and copied.read_text() == "VALUE = 1\n"
    outside.write_text("VALUE = 2\n")  # what the file becomes later does not reach the queued jobs
    assert copied.read_text() == "VALUE = 1\n"
    assert (first.path / "inside_abs").readlink() == Path("tinygpt")  # relative: the snapshot's, not the checkout's
    assert (first.path / "inside_abs" / "model.py").is_file()

    # A one-line change makes a new snapshot that shares every other file with the first (one inode each)
    model = checkout / "tinygpt" / "model.py"
    model.write_text(model.read_text() + "# changed\n")
    second = snapshot.take(checkout, dest)
    assert second.digest != first.digest
    shared = [rel for rel in git(checkout, "ls-files").split() if (first.path / rel).is_file()
              and not (first.path / rel).is_symlink()
              and (first.path / rel).stat().st_ino == (second.path / rel).stat().st_ino]
    assert "tinygpt/training/trainer.py" in shared and "tinygpt/model.py" not in shared
    files = [rel for rel in git(checkout, "ls-files").split() if (first.path / rel).is_file()
             and not (first.path / rel).is_symlink()]
    assert sorted(shared) == sorted(set(files) - {"tinygpt/model.py", "outside_link.py"})  # all but the changed
    assert (second.path / "hpc_lab" / "04_tinygpt" / "train.sbatch").stat().st_mode & 0o111

    # Refused, naming the file and the way out: a link outside to a folder, and a file over the size limit
    (checkout / "outside_dir").symlink_to(tmp_path)
    git(checkout, "add", "outside_dir")
    with pytest.raises(snapshot.LaunchError, match="outside_dir is a link to .* outside the repository and not a"):
        snapshot.take(checkout, dest)
    git(checkout, "rm", "-q", "--cached", "outside_dir")
    (checkout / "big.bin").write_bytes(b"\0" * 2_000_001)
    git(checkout, "add", "big.bin")
    with pytest.raises(snapshot.LaunchError, match=r"big.bin is 2.0 MB, over the 2 MB .* `snapshot_max_file_mb`"):
        snapshot.take(checkout, dest, max_file_bytes=2_000_000)
    assert snapshot.take(checkout, dest, max_file_bytes=3_000_000).files == first.files + 1


def test_a_projects_identity_is_its_files_but_the_spec(tmp_path):
    """What a relaunch's code_counts compares: the spec in the project is no code of the program (a grid point
    added to it changes no run), its program is."""
    project = tmp_path / "p"
    project.mkdir()
    (project / "prog.sh").write_text("echo 1\n")
    spec = project / "sweep.yaml"

    def identity() -> str:
        return snapshot.read(project, everything=True).identity(project, spec)
    spec.write_text("name: s\n")
    before = identity()
    spec.write_text("name: s\ngrid: {x: [1, 2, 3]}\n")
    assert identity() == before and snapshot.read(project, everything=True).digest != before
    (project / "prog.sh").write_text("echo 2\n")
    assert identity() != before
