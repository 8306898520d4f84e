"""Every command from a laptop, over SSH, against the local cluster's login node (up.sh --login): this test is the
laptop, with Slurm's commands hidden from it; the login node's sshd, its user tgstudent and its /cluster (which
the laptop does not have) are real. The README's "From your laptop" commands, with a profile of their own here."""

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.cluster_gate import LOCAL_CLUSTER_HOME
from tests.support.laptop import (
    KEYS,
    REMOTE_DIR,
    home_there,
    jobs_named,
    laptop_for,
    on_laptop,
    watch_interrupted_then_cancelled,
    write_spec,
)
from tests.support.paths import ROOT
from tests.support.processes import python_env
from tests.support.slurm import unique_name
from tinygpt.launch.remote import laptop as remote
from tinygpt.launch.remote import private_folders
from tinygpt.launch.spec import profiles

pytestmark = [pytest.mark.slurm(needs=["login"]), pytest.mark.shares_cluster]  # (its jobs wait for CPUs like others')

HOME_THERE = home_there("tgstudent")


@pytest.fixture(scope="module")
def laptop(tmp_path_factory, worker_id) -> dict:
    """The laptop of this module's tests: a remote_dir of each test worker's own, as tests beside each other run
    on several workers (two laptops launching into one remote_dir at once is not what a user does)."""
    return laptop_for("tgstudent", tmp_path_factory.mktemp("laptop"), remote_dir=f"{REMOTE_DIR}-{worker_id}")


def test_a_sweep_launched_from_the_laptop_runs_there_and_its_report_comes_back(laptop, tmp_path):
    name = unique_name("laptop")
    spec = write_spec(tmp_path, name)
    args = ["--workdir", str(tmp_path)]
    out = on_laptop(laptop, str(spec), "--cluster", str(laptop["profile"]), *args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    # (the hint names the laptop's command and --workdir, though the login node printed it)
    assert "submitted 2 run(s) as job array" in out.stdout and f"launch.py status {spec} --workdir {tmp_path}`" in \
        out.stdout, out.stdout
    assert "bytes sent to login" in out.stderr
    record = json.loads((tmp_path / "jobs" / name / "remote.json").read_text())
    assert record["root"] == "/" + str(laptop["there"].relative_to(LOCAL_CLUSTER_HOME))
    assert not (tmp_path / "jobs" / name / "manifest.json").exists()  # (the login node keeps the sweep)
    assert (laptop["there"] / "jobs" / name / "manifest.json").is_file()

    watched = on_laptop(laptop, "status", str(spec), "--watch", "--interval", "1", *args, cwd=tmp_path)
    assert watched.returncode == 0, watched.stderr
    final = watched.stdout.rsplit(f"sweep {name}", 1)[-1]
    assert final.count("COMPLETED") == 2, watched.stdout

    again = on_laptop(laptop, "resubmit", str(spec), "--dry-run", *args, cwd=tmp_path)
    assert again.returncode == 0 and "nothing to resubmit" in again.stdout, again
    logs = on_laptop(laptop, "logs", str(spec), "lr-0.002", "--tail", "3", *args, cwd=tmp_path)
    assert logs.returncode == 0 and logs.stdout.strip(), logs.stderr

    report = on_laptop(laptop, "report", str(spec), *args, cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    here = tmp_path / "runs" / name
    assert "lr-0.001" in (here / "report.md").read_text() and (here / "val_loss.png").is_file()
    assert sorted(p.parent.name for p in here.glob("*/metrics.jsonl")) == ["lr-0.001", "lr-0.002"]
    assert not list(here.glob("*/checkpoints"))  # (checkpoints only with pull --checkpoints)
    pulled = on_laptop(laptop, "pull", str(spec), "--checkpoints", *args, cwd=tmp_path)
    assert pulled.returncode == 0 and len(list(here.glob("*/checkpoints/*.pt"))) >= 2, pulled.stderr


def test_ctrl_c_on_the_laptop_stops_the_watch_there_and_a_held_sweep_is_cancelled(laptop, tmp_path):
    name = unique_name("laptop-held")
    spec = write_spec(tmp_path, name)
    args = ["--workdir", str(tmp_path)]
    out = on_laptop(laptop, str(spec), "--cluster", str(laptop["profile"]), "--hold", *args, cwd=tmp_path)
    try:
        assert out.returncode == 0, out.stderr
        watch_interrupted_then_cancelled(laptop, spec, args, tmp_path)
    finally:  # (held jobs never end by themselves)
        subprocess.run(["scancel", "--name", name], timeout=60)


def test_a_second_launch_sends_only_the_files_that_changed(laptop, tmp_path):
    conn = remote.Connection(profiles.from_file(laptop["profile"]).login)
    conn.root = json.loads(conn.call("hello"))["root"]
    marker = unique_name("content").encode()
    files = [("a.py", b"print('a')\n" + marker, "file"), ("b/c.txt", b"c" * 5000 + marker, "file"),
             ("run.sh", b"#!/bin/sh\necho " + marker + b"\n", "exec")]
    first = remote.send_tree(conn, f"t-{marker.decode()}-1", files)
    assert first == sum(len(f"{'0' * 64} {len(d)}\n") + len(d) for _, d, _ in files)
    assert remote.send_tree(conn, f"t-{marker.decode()}-2", files) == 0
    changed = [files[0], ("b/c.txt", b"d" * 5000 + marker, "file"), files[2]]
    assert remote.send_tree(conn, f"t-{marker.decode()}-3", changed) == len(f"{'0' * 64} 5000\n") + 5000 + \
        len(marker)
    tree = laptop["there"] / "trees" / f"t-{marker.decode()}-3"
    assert (tree / "b" / "c.txt").read_bytes() == changed[1][1] and os.access(tree / "run.sh", os.X_OK)


def _profile_with(laptop: dict, folder: Path, **login) -> Path:
    data = yaml.safe_load(laptop["profile"].read_text())
    data["login"].update(login)
    path = folder / "variant.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_each_way_the_login_node_cannot_be_used_is_one_message_and_nothing_is_submitted(laptop, tmp_path,
                                                                                         monkeypatch):
    other = tmp_path / "id_other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True, timeout=30)
    empty = tmp_path / "known_hosts_empty"
    empty.write_text("")
    changed = tmp_path / "known_hosts_changed"
    changed.write_text(f"login,10.77.0.2 {other.with_suffix('.pub').read_text().split()[0]} "
                       f"{other.with_suffix('.pub').read_text().split()[1]}\n")
    cases = {
        "unreachable": ({"port": 2222}, 75, "cannot reach the login node login"),
        "wrong key": ({"identity_file": str(other)}, 255, "refused the login of tgstudent"),
        "unknown host key": ({"options": {"UserKnownHostsFile": str(empty)}}, 255, "host key is not known"),
        "changed host key": ({"options": {"UserKnownHostsFile": str(changed)}}, 255, "host key has CHANGED"),
        "no python": ({"python": "/usr/bin/python9"}, 1, "has no `/usr/bin/python9`"),
    }
    monkeypatch.setenv(private_folders.ENV, laptop["env"][private_folders.ENV])  # (the laptop's connection)
    for case, (login, status, said) in cases.items():
        folder = tmp_path / case.replace(" ", "-")
        folder.mkdir()
        name = unique_name("laptop-refused")
        spec = write_spec(folder, name)
        remote.Connection(profiles.from_file(laptop["profile"]).login).close()  # (a shared one would be reused)
        out = on_laptop(laptop, str(spec), "--cluster", str(_profile_with(laptop, folder, **login)), "--workdir",
                        str(folder), cwd=folder)
        assert (out.returncode, out.stderr.count("error: ")) == (status, 1), (case, out.stderr)
        assert said in out.stderr and "Traceback" not in out.stderr, (case, out.stderr)
        assert not (folder / "jobs").exists() and not jobs_named(name), case
        assert not (laptop["there"] / "jobs" / name).exists(), case


def test_a_full_disk_on_the_login_node_is_said_and_nothing_is_submitted(laptop, tmp_path):
    """A small file system at remote_dir, mounted in the login node's own view of the files only."""
    sshd = (LOCAL_CLUSTER_HOME / "run" / "login" / "sshd.pid").read_text().strip()
    small = HOME_THERE.relative_to(LOCAL_CLUSTER_HOME / "cluster")
    where = f"/cluster/{small}/small-disk"
    (HOME_THERE / "small-disk").mkdir(exist_ok=True)
    user = pwd.getpwnam("tgstudent")
    mount = ["nsenter", "-t", sshd, "-m", "mount", "-t", "tmpfs", "-o",
             f"size=256k,mode=0700,uid={user.pw_uid},gid={user.pw_gid}", "tmpfs", where]
    subprocess.run(mount, check=True, timeout=30)
    try:
        name = unique_name("laptop-full")
        spec = write_spec(tmp_path, name)
        profile = _profile_with(laptop, tmp_path, remote_dir="small-disk")
        out = on_laptop(laptop, str(spec), "--cluster", str(profile), "--workdir", str(tmp_path), cwd=tmp_path)
        assert out.returncode == 1 and "disk (or your quota) is full" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr and not jobs_named(name)
        assert not (tmp_path / "jobs").exists()
    finally:
        subprocess.run(["nsenter", "-t", sshd, "-m", "umount", where], timeout=30)


def test_hostile_values_reach_the_login_node_as_text_and_run_nothing(laptop, tmp_path):
    """In the spec's file name and in options: each travels to the login node's shell quoted (a shell there runs
    in the home, a launch in remote_dir: `touch pwned` would leave its file in one of them)."""
    hostile = ["$(touch pwned)", "`touch pwned`", "; touch pwned", "'; touch pwned; '", "\"; touch pwned; \"",
               "x\ntouch pwned", "$'\\n'touch pwned", "-h", "--cluster=local"]
    name = unique_name("laptop-hostile")
    spec = write_spec(tmp_path, name).rename(tmp_path / "$(touch pwned);`touch pwned`'\n.yaml")
    sets = [arg for i, value in enumerate(hostile) for arg in ("--set", f"wandb_{('project', 'entity')[i % 2]}"
                                                                         f"={value}")]
    for extra in (sets, ["--set", "wandb_project=x"]):
        out = on_laptop(laptop, str(spec), "--cluster", str(laptop["profile"]), "--dry-run", *extra, "--workdir",
                        str(tmp_path), cwd=tmp_path)
        assert "Traceback" not in out.stderr and out.returncode in (0, 1), out.stderr
    assert out.returncode == 0 and "dry run: nothing submitted" in out.stdout, out.stderr
    assert not (HOME_THERE / "pwned").exists() and not (laptop["there"] / "pwned").exists()


def test_a_profile_written_from_the_laptop_reaches_the_login_node_it_asked(laptop, tmp_path):
    """`profile new --login`: the login node's Slurm describes its cluster; the profile gets the login: section
    that reached it, and a dry run through it goes there."""
    keys = ["--ssh-option", f"IdentityFile={KEYS / 'id_ed25519'}",
            "--ssh-option", f"UserKnownHostsFile={KEYS / 'known_hosts'}"]
    out = on_laptop(laptop, "profile", "new", "--login", "tgstudent@login", *keys, "--dir", str(tmp_path), "--name",
                    "fromlaptop", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    profile = profiles.from_file(tmp_path / "fromlaptop.yaml")
    assert (profile.cluster_name, profile.login.host, profile.login.user) == ("local", "login", "tgstudent")
    assert sorted(profile.partitions) == ["debug", "high", "last", "low", "low-cancel", "short"]
    again = on_laptop(laptop, "profile", "new", "--login", "tgstudent@login", *keys, "--dir", str(tmp_path),
                      "--name", "fromlaptop", cwd=tmp_path)
    assert again.returncode == 1 and "exists; nothing was written" in again.stderr
    spec = write_spec(tmp_path, unique_name("laptop-profile"))
    dry = on_laptop(laptop, str(spec), "--cluster", str(tmp_path / "fromlaptop.yaml"), "--dry-run", "--workdir",
                    str(tmp_path), cwd=tmp_path)
    assert dry.returncode == 0 and "dry run: nothing submitted" in dry.stdout, dry.stderr


def test_a_program_of_the_users_launched_from_the_laptop_runs_its_project_there(laptop, tmp_path):
    """command: with a project folder of the laptop's (tests/support/foreign, which the cluster does not have):
    the project travels as a snapshot, and the run counts there."""
    name = unique_name("laptop-command")
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump({"name": name, "resources": {"time": "00:05:00"}, "command": {
        "argv": ["./count.sh", "{goal}"], "values": {"goal": 2}, "project": str(ROOT / "tests/support/foreign")}}))
    args = ["--workdir", str(tmp_path)]
    out = on_laptop(laptop, str(spec), "--cluster", str(laptop["profile"]), *args, cwd=tmp_path)
    assert out.returncode == 0 and "submitted 1 run(s)" in out.stdout, out.stderr
    tracked = subprocess.run(["git", "ls-files", "tests/support/foreign"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    assert f"({ROOT / 'tests/support/foreign'}): {len(tracked)} files" in out.stderr, out.stderr  # (the project, sent)
    watched = on_laptop(laptop, "status", str(spec), "--watch", "--interval", "1", *args, cwd=tmp_path)
    assert "COMPLETED" in watched.stdout.rsplit(f"sweep {name}", 1)[-1], watched
    logs = on_laptop(laptop, "logs", str(spec), "base", *args, cwd=tmp_path)
    assert logs.returncode == 0 and "counted to 2" in logs.stdout, logs
    trees = laptop["there"] / "trees"
    assert any((tree / "count.sh").is_file() and (tree / "fit.py").is_file() for tree in trees.iterdir())
    document = json.loads(on_laptop(laptop, "status", str(spec), "--json", *args, cwd=tmp_path).stdout)
    assert [(r["name"], r["state_name"]) for r in document["runs"]] == [("base", "COMPLETED")], document
    listed = on_laptop(laptop, "list", *args, cwd=tmp_path)
    assert listed.returncode == 0 and f"{name}  " in listed.stdout and "1 run(s): 1 COMPLETED" in listed.stdout, listed
    assert f"on {laptop['user']}@" in listed.stdout, listed.stdout


NOTEBOOK_ON_A_LAPTOP = """\
import json, sys
from tinygpt.launch import api

workdir, profile, name = sys.argv[1:]
spec = {"name": name, "train": {"dataset": "pydoc", "max_steps": 12, "n_layer": 1, "n_head": 2, "n_embd": 32,
        "block_size": 32, "batch_size": 8, "eval_interval": 6}, "grid": {"lr": [0.001]}}
sweep = api.launch(spec, workdir, cluster=profile)
done = sweep.wait(timeout=240, poll=1)
try:
    sweep.metrics(["nope"])
except api.LaunchError as err:
    refused = [type(err).__name__, str(err)]
print(json.dumps({"type": type(sweep).__name__, "runs": sweep.runs, "status": done.model_dump(mode="json"),
                  "metrics": {run: [r["step"] for r in records if "val_loss" in r]
                              for run, records in sweep.metrics().items()},
                  "logs": [(log.job, log.text) for log in sweep.logs("lr-0.001")],
                  "followed": "".join(sweep.follow("lr-0.001", poll=0.2)),
                  "efficiency": sweep.efficiency(), "refused": refused, "cancelled": sweep.cancel()}))
"""


def test_the_library_on_the_laptop_launches_there_and_its_sweep_answers_as_the_commands_do(laptop, tmp_path):
    """A notebook on a laptop (the library alone, a profile with `login:`): `api.launch` goes to the login node as
    `launch.py SPEC --cluster NAME` does, and the Sweep it gives is answered by the library there: wait, metrics,
    logs and following one, efficiency, cancel, a refusal of the same kind and words, and the status document
    equal to the laptop's `status --json` of the same sweep."""
    name = unique_name("laptop-lib")
    script = tmp_path / "notebook.py"
    script.write_text(NOTEBOOK_ON_A_LAPTOP)
    out = subprocess.run([sys.executable, str(script), str(tmp_path), str(laptop["profile"]), name], cwd=tmp_path,
                         env=python_env(**laptop["env"]), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    said = json.loads(out.stdout.strip().splitlines()[-1])
    assert (said["type"], said["runs"]) == ("RemoteSweep", ["lr-0.001"]), said
    assert [r["state_name"] for r in said["status"]["runs"]] == ["COMPLETED"] and said["metrics"] == {
        "lr-0.001": [6, 12]}, said
    (job, text), = said["logs"]
    assert job == said["status"]["runs"][0]["job"] and "val    12/12" in text, text
    assert said["followed"].endswith(text)  # (the whole log of its one life, followed until the job had ended)
    assert [row["run"] for row in said["efficiency"]] == ["lr-0.001"] and said["cancelled"], said
    assert said["refused"] == ["LaunchError", f"runs: nope not in sweep `{name}`; its runs: lr-0.001"]
    command = on_laptop(laptop, "status", str(tmp_path / f"{name}.yaml"), "--json", "--workdir", str(tmp_path),
                        cwd=tmp_path)
    document = json.loads(command.stdout)

    def timeless(doc: dict) -> dict:
        """The document less what differs between two made at different times of the same ended sweep: when, and
        which daemon answered (squeue until the controller forgets the ended job, sacct after)."""
        return {**doc, "time": 0, "runs": [{**r, "source": None} for r in doc["runs"]]}

    assert timeless(document) == timeless(said["status"])
