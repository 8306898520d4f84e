"""What another user of the login node can read or change of a user's work there: nothing. The launcher makes
remote_dir and all in it the user's alone (folders 0700, files 0600, also what the jobs write: sbatch passes on
the umask), and refuses a remote_dir that another user can write before anything is sent. The second user is
tgpeer, an ordinary user of the local cluster's login node with an account of its own (lib.sh's LOGIN_OTHERS)."""

import stat

import pytest
import yaml

from tests.support.laptop import laptop_for, on_laptop, on_login, write_spec
from tests.support.slurm import unique_name

pytestmark = [pytest.mark.slurm(needs=["login"]), pytest.mark.shares_cluster]

PEER = "tgpeer"


def what_peer_can_do(paths: list[str], folders: list[str]) -> list[str]:
    """What tgpeer, logged in, could do of each: read a file, list a folder, make a file in a folder."""
    checks = [f"cat '{p}' >/dev/null 2>&1 && echo 'read {p}'" for p in paths]
    checks += [f"ls '{f}' >/dev/null 2>&1 && echo 'listed {f}'; touch '{f}/planted' 2>/dev/null && echo 'wrote {f}'"
               for f in folders]
    done = on_login(PEER, "; ".join(checks) + "; true")
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_another_user_can_neither_read_nor_change_a_users_sweeps_code_or_logs(tmp_path):
    laptop = laptop_for("tgstudent", tmp_path, remote_dir="tinygpt-hpc-privacy")
    name = unique_name("private")
    spec = write_spec(tmp_path, name, grid=[0.001])
    args = ["--workdir", str(tmp_path)]
    out = on_laptop(laptop, str(spec), "--cluster", str(laptop["profile"]), *args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    watched = on_laptop(laptop, "status", str(spec), "--watch", "--interval", "1", *args, cwd=tmp_path)
    assert "COMPLETED" in watched.stdout.rsplit(f"sweep {name}", 1)[-1], watched

    there = laptop["there"]
    files = [p for p in there.rglob("*") if p.is_file() and not p.is_symlink()]
    folders = [p for p in there.rglob("*") if p.is_dir() and not p.is_symlink()] + [there]
    assert {stat.S_IMODE(f.stat().st_mode) & 0o077 for f in files + folders} == {0}, \
        [f"{f}: {stat.S_IMODE(f.stat().st_mode):04o}" for f in files + folders if f.stat().st_mode & 0o077]
    kinds = {"code": [p for p in files if "/trees/" in str(p) and p.name == "launch.py"],
             "objects": [p for p in files if "/objects/" in str(p)],
             "manifest": list(there.glob("jobs/*/manifest.json")),
             "logs": [p for p in files if p.suffix in (".out", ".log")],
             "metrics": list(there.glob("runs/*/*/metrics.jsonl")),
             "checkpoints": list(there.glob("runs/*/*/checkpoints/*.pt"))}
    assert all(kinds.values()), {k: len(v) for k, v in kinds.items()}  # (each kind is there to be tried)
    on_cluster = [str(p).replace(str(there.parents[2]), "/cluster") for k in kinds.values() for p in k[:2]]
    places = [str(f).replace(str(there.parents[2]), "/cluster") for f in folders if f.name in
              ("objects", "trees", "jobs", "runs", "logs", there.name)]
    assert what_peer_can_do(on_cluster, places) == []


def test_a_remote_dir_others_can_write_is_refused_before_anything_is_sent(tmp_path):
    laptop = laptop_for(PEER, tmp_path, remote_dir="tinygpt-hpc-open")
    there = laptop["there"]
    # (anew: a run of this test before, on the same cluster, leaves the folder it ends by using)
    assert on_login(PEER, f"rm -rf {there.name} && mkdir {there.name} && chmod 777 {there.name}").returncode == 0
    name = unique_name("open")
    spec = write_spec(tmp_path, name, grid=[0.001])
    out = on_laptop(laptop, str(spec), "--cluster", str(laptop["profile"]), "--workdir", str(tmp_path), cwd=tmp_path)
    assert out.returncode == 1 and out.stderr.count("error: ") == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"{there.name} (login.remote_dir) can be changed by every user of the login node (mode 0777)" in out.stderr
    assert "nothing was sent" in out.stderr and list(there.iterdir()) == [] and not (tmp_path / "jobs").exists()

    assert on_login(PEER, f"chmod 770 {there.name}").returncode == 0  # (a lab's folder, shared with its group)
    out = on_laptop(laptop, str(spec), "--cluster", str(laptop["profile"]), "--dry-run", "--workdir", str(tmp_path),
                    cwd=tmp_path)
    assert out.returncode == 1 and "login.trust_group: true" in out.stderr and list(there.iterdir()) == [], out.stderr
    profile = yaml.safe_load(laptop["profile"].read_text())
    profile["login"]["trust_group"] = True
    laptop["profile"].write_text(yaml.safe_dump(profile))
    out = on_laptop(laptop, str(spec), "--cluster", str(laptop["profile"]), "--dry-run", "--workdir", str(tmp_path),
                    cwd=tmp_path)
    assert out.returncode == 0 and "dry run: nothing submitted" in out.stdout, out.stderr
