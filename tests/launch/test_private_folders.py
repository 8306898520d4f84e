"""The laptop's private folders (the shared SSH connection's sockets, the wheel cache) are the user's own, or
nothing is sent: a folder another user planted (world-writable, or a link to one of theirs) is refused with its
path and the fix, before ssh is ever run. The tests point the folders elsewhere ($TINYGPT_SSH_SOCKETS,
$XDG_CACHE_HOME), so that a planted folder never meets another test's command."""

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tinygpt.launch.errors import LaunchError
from tinygpt.launch.remote import laptop, private_folders
from tinygpt.launch.spec import profiles

NOBODY = 65534
ROOT = Path(__file__).parents[2]


@pytest.fixture
def short():
    """A folder under /tmp with a path short enough for ssh's sockets (pytest's tmp_path is too long)."""
    folder = Path(tempfile.mkdtemp(prefix="ts-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def someone_elses(folder: Path) -> Path:
    """A folder of another user's, open to all: made and given away as root; for any other user, one of root's."""
    if os.getuid() != 0:
        return Path("/var/tmp") if Path("/var/tmp").stat().st_uid != os.getuid() else Path("/")
    folder.mkdir(mode=0o777)
    os.chmod(folder, 0o777)  # (past the umask)
    os.chown(folder, NOBODY, -1)
    return folder


def connect_through(folder: Path, monkeypatch) -> laptop.Connection:
    monkeypatch.setenv(private_folders.ENV, str(folder))
    return laptop.Connection(profiles.Login(host="login", user="ann"))


def test_another_users_folder_is_refused_before_ssh_runs(tmp_path, monkeypatch):
    planted = someone_elses(tmp_path / "planted")
    ran = tmp_path / "ssh-ran"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "ssh").write_text(f"#!/bin/sh\ntouch {ran}\n")
    (tmp_path / "bin" / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    with pytest.raises(LaunchError, match=rf"cluster: {planted}, the folder for the SSH connection's sockets, "
                                          r"(belongs to another user \(uid \d+\)|is open to other users)"):
        connect_through(planted, monkeypatch)
    assert not ran.exists() and (os.getuid() != 0 or list(planted.iterdir()) == [])


def test_a_link_to_another_users_folder_is_refused(tmp_path, monkeypatch):
    link = tmp_path / "link"
    link.symlink_to(someone_elses(tmp_path / "theirs"))
    with pytest.raises(LaunchError, match=rf"{link}, the folder for the SSH connection's sockets, is a symbolic "
                                          r"link: another user could take over .* set TINYGPT_SSH_SOCKETS to a folder"):
        connect_through(link, monkeypatch)


def test_a_folder_of_ones_own_others_can_write_is_refused_and_one_they_can_only_read_is_made_private(
        short, monkeypatch):
    own = short / "own"
    own.mkdir()
    own.chmod(0o777)
    with pytest.raises(LaunchError, match=r"can be written by other users \(mode 0777\)"):
        connect_through(own, monkeypatch)
    own.chmod(0o755)  # (nothing could have been planted: only reading it is taken away)
    assert f"ControlPath={own}/%C" in connect_through(own, monkeypatch).options
    assert stat.S_IMODE(own.stat().st_mode) == 0o700


def test_the_wheel_cache_is_the_users_alone(tmp_path, monkeypatch):
    """What the login node's launcher installs comes from this cache: one another user could write is refused."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    made = private_folders.wheel_cache()
    assert made == tmp_path / "cache" / "tinygpt-hpc" and stat.S_IMODE(made.stat().st_mode) == 0o700
    made.chmod(0o775)
    with pytest.raises(LaunchError, match=r"the cache of the launcher's packages for login nodes, can be written by "
                                          r"other users \(mode 0775\): another user could change the code"):
        private_folders.wheel_cache()
    made.rmdir()
    made.symlink_to(someone_elses(tmp_path / "theirs"))
    with pytest.raises(LaunchError, match=r"is a symbolic link"):
        private_folders.wheel_cache()


def test_a_missing_folder_is_made_private_and_the_runtime_folder_is_taken_when_it_is_the_users_alone(
        short, monkeypatch):
    made = short / "new"
    connect_through(made, monkeypatch)
    assert stat.S_IMODE(made.stat().st_mode) == 0o700 and made.stat().st_uid == os.getuid()
    monkeypatch.delenv(private_folders.ENV)
    runtime = short / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert private_folders.socket_folder() == runtime / "tinygpt-ssh"
    runtime.chmod(0o755)  # (not the user's alone: /tmp's own folder instead)
    assert private_folders.socket_folder() == Path("/tmp") / f"tinygpt-ssh-{os.getuid()}"
    with pytest.raises(LaunchError, match=r"has a path longer than 49 characters, too long for ssh's sockets"):
        connect_through(short / ("x" * 40), monkeypatch)


def test_a_planted_folder_stops_a_command_from_the_laptop_with_one_message(tmp_path):
    """`launch.py check` of a spec whose profile names a login node: exit 1, the folder and the fix, no traceback."""
    planted = someone_elses(tmp_path / "planted")
    profile = tmp_path / "remote.yaml"
    profile.write_text((ROOT / "hpc_lab" / "clusters" / "local-login.yaml").read_text())
    (tmp_path / "s.yaml").write_text(f"name: s\ncluster: {profile}\n")
    env = {**os.environ, private_folders.ENV: str(planted), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(ROOT / "launch.py"), "check", str(tmp_path / "s.yaml")],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"{planted}, the folder for the SSH connection's sockets" in out.stderr
