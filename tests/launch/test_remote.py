"""Working from a laptop, the parts that need no SSH server: what reaches the login node's shell, the command line
rebuilt for it, the profile's `login:` section, and the login node's half (login_side.py) run here as a process,
as ssh would run it there. cluster/test_login_node.py runs it all over SSH against the local cluster's login node."""

import hashlib
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.processes import run_cli
from tinygpt.launch import errors
from tinygpt.launch.commands import cli
from tinygpt.launch.errors import LaunchError
from tinygpt.launch.remote import laptop
from tinygpt.launch.spec import profiles

# What a hostile spec name, path or option may hold: every character a shell reads specially, and any other.
# (No lone surrogate but those that stand for bytes that are not UTF-8, as a command line's undecodable bytes are
# read: no other can be given to a program.)
HOSTILE = st.text(st.sampled_from("$()`;&|<>'\"\\\n\t *?[]{}~#!=%^")
                  | st.characters(exclude_characters="\0", exclude_categories=("Cs",))
                  | st.characters(min_codepoint=0xDC80, max_codepoint=0xDCFF), max_size=12)
# The characters no login shell (sh, bash, zsh, fish, tcsh, csh) reads specially outside quotes, but space.
PLAIN = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789/._+- ")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(HOSTILE, min_size=1, max_size=4))
def test_the_words_of_a_request_arrive_exactly_and_the_login_shell_sees_none_of_them(words, tmp_path):
    """The login shell is handed `PYTHON -` alone; the command's words travel in the program it reads, and arrive
    as they left: nothing in them runs (no file appears, whatever `$(...)`, backticks or `;` they hold)."""
    marker = tmp_path / "ran"
    words = [w.replace("MARK", str(marker)) for w in words] + [f"$(touch {marker})", f"`touch {marker}`",
                                                               f"; touch {marker}"]
    conn = laptop.Connection(profiles.Login(host="login", python="/usr/bin/python3"))
    assert set(conn.argv()[-1]) <= PLAIN and conn.argv()[-1] == "/usr/bin/python3 -"
    conn.root = str(tmp_path / "root")
    echo = [sys.executable, "-c", "import sys; sys.stdout.write('\\0'.join(sys.argv[1:]))", *words]
    out = side_request(conn, "run", str(tmp_path), "--", *echo)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split(b"\n", 1)[1].decode("utf-8", "surrogateescape").split("\0") == words
    assert not marker.exists()


def test_what_the_login_shells_startup_files_print_is_not_read_as_the_answer(tmp_path):
    """A banner on stdout and stderr before the answer (as a .bashrc that echoes prints it) is dropped."""
    conn = laptop.Connection(profiles.Login(host="login"))
    conn.root = str(tmp_path / "root")
    program, marker = conn.request("hello")
    banner = "echo 'Welcome to login'; echo '*** maintenance on Friday ***' >&2; "
    out = subprocess.run(["bash", "-c", banner + "python3 -"], input=program, capture_output=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith(b"Welcome to login\n")
    assert json.loads(laptop.answer(out.stdout, marker))["root"] == conn.root
    assert laptop.answer(out.stderr, marker) == b""
    refused = conn.failure(1, b"*** maintenance ***\n" + marker + b"\nerror: the disk is full\n", marker)
    assert str(refused) == "cluster: on the login node login: the disk is full"


@pytest.mark.parametrize("said, shown", [
    ("dash: 1: python9: not found", "has no `python9` (its login shell said: dash: 1: python9: not found)"),
    ("fish: Unknown command: python9\nfish:\npython9 -\n^~~~~~^", "its login shell said: fish: Unknown command"),
    ("python9: Command not found.", "has no `python9` (its login shell said: python9: Command not found.)"),
    ("This account is currently not available.", "did not run `python9 -` (This account is currently not "
                                                  "available.): a login shell that runs no commands"),
], ids=["dash", "fish", "tcsh", "nologin"])
def test_a_login_shell_that_never_started_the_login_side_is_named_with_its_fix(said, shown):
    failed = laptop.Connection(profiles.Login(host="login", python="python9")).failure(1, said.encode(), b"M")
    assert shown in str(failed) and "Traceback" not in str(failed)


LAPTOP_COMMANDS = [
    ["launch", "s.yaml", "--cluster", "c", "--set", "lr=0.1", "--set", "x=$(id)\n`id`;", "--hold", "--dry-run"],
    ["check", "s.yaml", "--cluster", "c", "--chain", "--no-snapshot"],
    ["status", "s.yaml", "--watch", "--interval", "2.5", "--all", "--workdir", "/laptop"],
    ["resubmit", "s.yaml", "--time", "04:00:00", "--exclude", "node[1-2]", "--exclude", "n3", "--dry-run",
     "--states", "FAILED"],
    ["logs", "s.yaml", "lr=0.1", "--tail", "5", "--follow"],
    ["report", "s.yaml", "--prompt", "ROMEO: '; rm -rf ~'"], ["report", "s.yaml", "--prompt=-h"],
    ["logs", "--tail", "2", "--", "-s.yaml", "--all"],
    ["cancel", "s.yaml"], ["sync", "s.yaml", "--dry-run"], ["pull", "s.yaml", "--checkpoints"],
]


@pytest.mark.parametrize("argv", LAPTOP_COMMANDS, ids=lambda argv: argv[0])
def test_the_command_sent_is_the_command_given_with_the_login_nodes_paths(argv):
    """Rebuilt from the parsed options, not from the laptop's words: parsed there, it is what was parsed here,
    but for the spec, the profile and the work directory, which are the login node's."""
    top = cli.parser()
    here = top.parse_args(argv)
    given = {"spec": "/c/trees/inputs-1/s.yaml", "workdir": "/c"} | ({"cluster": "/c/p.yaml"}
                                                                    if hasattr(here, "cluster") else {})
    there = top.parse_args(laptop._arguments(top, here, **given))
    assert vars(there) == vars(here) | given


def test_a_profiles_login_section_is_checked_field_by_field(tmp_path):
    base = yaml_profile(tmp_path, {"host": "login", "user": "ann", "port": 2222, "remote_dir": "~/tg",
                                   "options": {"ProxyJump": "gate.example.edu"}})
    assert profiles.from_file(base).login.port == 2222
    with pytest.raises(LaunchError) as err:
        profiles.from_file(yaml_profile(tmp_path, {"host": "-vvv", "user": "a b", "port": 0,
                                                   "remote_dir": "a\nb", "options": {"Proxy Command": "x",
                                                                                     "ProxyJump": "a\nb"}}))
    said = "\n".join(err.value.problems)
    for field in ("login.host", "login.user", "login.port", "login.remote_dir", "login.options"):
        assert field in said, said
    assert "starts with '-'" in said


@pytest.mark.parametrize("said, answer", [
    ("ssh: connect to host login port 22: Connection refused", errors.LoginAway),
    ("ssh: connect to host login port 22: Connection timed out", errors.LoginAway),
    ("kex_exchange_identification: Connection closed by remote host\nConnection closed by UNKNOWN port 65535",
     errors.LoginAway),
    # (the same dead proxy under load: ssh's greeting is written before it sees the other end gone)
    ("banner exchange: Connection to UNKNOWN port 65535: Broken pipe", errors.LoginAway),
    ("ann@login: Permission denied (publickey).", errors.SshRefused),
    ("ssh: Could not resolve hostname login: Name or service not known", errors.SshRefused),
    ("No ED25519 host key is known for login and you have requested strict checking.\nHost key verification "
     "failed.", errors.SshRefused),
], ids=["refused", "timed-out", "closed", "banner-exchange", "denied", "unknown-name", "unknown-key"])
def test_what_ssh_says_of_a_failed_connection_is_a_host_away_or_a_refusal(said, answer):
    """ssh's own failures (exit 255), as ssh words them: a host that does not answer now is exit 75, try again
    later; a login or a host it will not accept is 255, with the fix."""
    failed = laptop.Connection(profiles.Login(host="login", user="ann")).failure(255, said.encode(), b"M")
    assert type(failed) is answer and failed.exit_status == (75 if answer is errors.LoginAway else 255)
    assert "login" in str(failed) and "nothing was sent" in str(failed)


def yaml_profile(folder: Path, login: dict) -> Path:
    path = folder / f"p{len(list(folder.iterdir()))}.yaml"
    path.write_text(json.dumps({"name": "p", "login": login}))
    return path


# ----------------------------------------------------------------------------------------------------
# The login node's half, as a process here


def side_request(conn: laptop.Connection, command: str, *args: str, stdin: bytes = b"",
                 **kw) -> subprocess.CompletedProcess:
    """What ssh does with a request: `PYTHON -` reads it; stdout and stderr as the laptop takes them (the marker
    line and what comes before it dropped)."""
    program, marker = conn.request(command, *args, stdin=stdin)
    out = subprocess.run([sys.executable, "-"], input=program, capture_output=True, timeout=60, **kw)
    return subprocess.CompletedProcess(out.args, out.returncode, laptop.answer(out.stdout, marker),
                                       laptop.answer(out.stderr, marker))


def side(root: Path, command: str, *args: str, stdin: bytes = b"", **kw) -> subprocess.CompletedProcess:
    conn = laptop.Connection(profiles.Login(host="login"))
    conn.root = str(root)
    return side_request(conn, command, *args, stdin=stdin, **kw)


def driving(root: Path, *args: str) -> subprocess.Popen:
    """login_side's `run` started as ssh starts it, streaming; its stdout's first line is the command's id."""
    conn = laptop.Connection(profiles.Login(host="login"))
    conn.root = str(root)
    program, marker = conn.request("run", *args)
    driver = subprocess.Popen([sys.executable, "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    driver.stdin.write(program)
    driver.stdin.close()
    assert driver.stdout.readline() == marker + b"\n" and driver.stderr.readline() == marker + b"\n"
    return driver


def payload(*contents: bytes) -> bytes:
    return b"".join(f"{hashlib.sha256(c).hexdigest()} {len(c)}\n".encode() + c for c in contents)


def test_contents_arrive_checked_and_a_damaged_transfer_stores_nothing(tmp_path):
    root = tmp_path / "root"
    assert side(root, "hello").returncode == 0
    good, other = b"print('hi')\n", b"x = 1\n"
    damaged = payload(other).replace(b"x = 1", b"x = 2")
    for stream in (damaged, payload(other)[:-3]):  # changed on the way; cut short
        out = side(root, "receive", stdin=stream)
        assert out.returncode == 1 and b"damaged or cut short" in out.stderr
    assert list((root / "objects").iterdir()) == []
    assert side(root, "receive", stdin=payload(good, other)).stdout == b"2\n"
    wanted = [hashlib.sha256(c).hexdigest() for c in (good, other, b"not sent")]
    assert json.loads(side(root, "missing", stdin=json.dumps(wanted).encode()).stdout) == wanted[2:]


def test_a_tree_is_made_whole_or_not_at_all_and_never_outside_its_folder(tmp_path):
    root = tmp_path / "root"
    side(root, "hello")
    script = b"#!/bin/sh\necho ok\n"
    side(root, "receive", stdin=payload(script))
    digest = hashlib.sha256(script).hexdigest()
    listing = {"files": [["bin/run", "exec", digest], ["a.txt", "file", digest], ["link", "link", "bin/run"]],
               "record": {"digest": "t1"}}
    assert side(root, "tree", "t1", stdin=json.dumps(listing).encode()).returncode == 0
    tree = root / "trees" / "t1"
    assert subprocess.run([tree / "bin" / "run"], capture_output=True).stdout == b"ok\n"
    assert not os.access(tree / "a.txt", os.X_OK) and os.readlink(tree / "link") == "bin/run"
    assert json.loads((tree / "SNAPSHOT.json").read_text()) == {"digest": "t1"}
    for bad in ({"files": [["../escaped", "file", digest]]}, {"files": [["ok", "file", "0" * 64]]}):
        out = side(root, "tree", "t2", stdin=json.dumps(bad).encode())
        assert out.returncode == 1 and b"error: " in out.stderr
    assert sorted(p.name for p in (root / "trees").iterdir() if not p.name.startswith(".in-")) == ["t1"]
    assert not (root / "escaped").exists() and not (root / "trees" / "escaped").exists()
    assert side(root, "tree", "../t3", stdin=b"{}").returncode == 1


def test_a_command_streams_its_output_and_status_and_outlives_a_dropped_connection(tmp_path):
    root = tmp_path / "root"
    out = side(root, "run", str(tmp_path), "GREETING=hi", "--", "sh", "-c", 'echo "$GREETING"; echo oops >&2; exit 3')
    ident, said = out.stdout.decode().split("\n", 1)
    assert out.returncode == 3 and said == "hi\n" and out.stderr == b"oops\n"
    assert (root / "commands" / ident / "status").read_text() == "3"

    go, ended = tmp_path / "go", tmp_path / "ended"
    waits = f"while [ ! -e {go} ]; do sleep 0.05; done; touch {ended}"
    driver = driving(root, str(tmp_path), "--", "sh", "-c", waits)
    ident = driver.stdout.readline().decode().strip()
    driver.kill()  # (the connection drops: sshd's end of it, the streaming process, is gone)
    driver.wait(timeout=30)
    go.touch()
    status = root / "commands" / ident / "status"
    deadline = time.monotonic() + 60
    while not status.exists():
        assert time.monotonic() < deadline, "the command did not outlive its connection"
        time.sleep(0.05)
    assert ended.exists() and status.read_text() == "0"


def test_ctrl_c_on_the_laptop_reaches_the_command(tmp_path):
    root = tmp_path / "root"
    started = tmp_path / "started"
    driver = driving(root, str(tmp_path), "--", sys.executable, "-c",
                     f"import time, pathlib; pathlib.Path({str(started)!r}).touch(); time.sleep(600)")
    ident = driver.stdout.readline().decode().strip()
    deadline = time.monotonic() + 60
    while not started.exists():
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.05)
    assert side(root, "signal", ident).returncode == 0
    assert driver.wait(timeout=60) == 130 and b"KeyboardInterrupt" in driver.stderr.read()


def test_a_login_node_without_the_launchers_python_is_told_what_failed(tmp_path):
    root = tmp_path / "root"
    side(root, "hello")
    (root / "trees" / "wheels-x").mkdir(parents=True)  # (no pip wheel, no package: the install must fail)
    out = side(root, "venv", "wheels-x", "pyyaml")
    assert out.returncode == 1 and b"could not set up the launcher's Python on the login node" in out.stderr
    assert [p for p in (root / "venvs").iterdir()] == []


def test_the_source_sent_runs_on_the_standard_library_alone(tmp_path):
    """login_side is the program `python3 -` reads: it may import nothing but the standard library (-S: no
    site-packages)."""
    program, marker = laptop.request("hello", str(tmp_path / "root"), marker="M"), b"M"
    out = subprocess.run([sys.executable, "-I", "-S", "-"], input=program, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(laptop.answer(out.stdout, marker))["root"] == str(tmp_path / "root")


def test_a_relative_path_that_names_a_laptop_file_is_refused_before_the_login_node_is_asked(tmp_path, monkeypatch):
    """Paths in a spec are the cluster's; `data_file: corpus.txt` beside the spec on the laptop is most likely
    meant as this file, which the jobs would never see: refused, with the fix, and no SSH is started (the host
    does not exist: an attempt would be another message)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text("some text\n")
    profile = yaml_profile(tmp_path, {"host": "login.example.invalid", "user": "ann"})
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps({"name": "s", "train": {"data_file": "corpus.txt"},
                                "grid": {"data_dir": ["data", "/cluster/data"]}}))
    code, err = run_cli([str(spec), "--cluster", str(profile)])
    assert code == 1 and "train.data_file: corpus.txt is a relative path, and names a file on this laptop" in err
    assert "grid.data_dir" not in err  # (`data` is no file here, and /cluster/data is absolute: the cluster's)
    assert "give the cluster's absolute path" in err and not (tmp_path / "jobs").exists()


def test_what_the_launcher_makes_on_the_login_node_is_the_users_alone(tmp_path):
    root = tmp_path / "root"
    assert side(root, "hello").returncode == 0
    side(root, "receive", stdin=payload(b"code\n"))
    digest = hashlib.sha256(b"code\n").hexdigest()
    listing = {"files": [["a.py", "file", digest], ["run", "exec", digest]], "record": {"digest": "t"}}
    side(root, "tree", "t", stdin=json.dumps(listing).encode())
    side(root, "run", str(root), "--", "sh", "-c", "mkdir -p runs/s && echo x > runs/s/out")
    modes = {str(p.relative_to(root)): stat.S_IMODE(p.lstat().st_mode) for p in root.rglob("*")}
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert {m for p, m in modes.items() if (root / p).is_dir()} == {0o700}
    assert modes["objects/" + digest] == 0o400 and modes["trees/t/run"] == 0o500
    assert {m for p, m in modes.items() if p.startswith(("runs/", "commands/")) and (root / p).is_file()} == {0o600}


@pytest.mark.parametrize("where, mode, trusted, refused", [
    ("", 0o777, True, "can be changed by every user of the login node (mode 0777)"),
    ("", 0o770, False, "can be changed by group"),
    ("", 0o770, True, None),
    ("trees", 0o757, True, "trees can be changed by every user of the login node"),
    ("objects", 0o775, False, "objects can be changed by group"),
], ids=["world", "group", "group-trusted", "world-trees", "group-objects"])
def test_a_remote_dir_that_others_can_write_is_refused_before_anything_is_read(tmp_path, where, mode, trusted,
                                                                                 refused):
    root = tmp_path / "root"
    (root / (where or "objects")).mkdir(parents=True)
    (root / where).chmod(mode)
    conn = laptop.Connection(profiles.Login(host="login", trust_group=trusted))
    conn.root = str(root)
    out = side_request(conn, "missing", stdin=b'["' + b"0" * 64 + b'"]')
    if refused is None:
        assert out.returncode == 0, out.stderr
        return
    assert out.returncode == 1 and refused in out.stderr.decode(), out.stderr
    assert "nothing was sent" in out.stderr.decode() and out.stdout == b""


def test_a_link_planted_among_the_launchers_folders_is_refused(tmp_path):
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    (tmp_path / "theirs").mkdir()
    (root / "venvs").symlink_to(tmp_path / "theirs")
    out = side(root, "hello")
    assert out.returncode == 1 and b"venvs is a symbolic link, which the launcher never makes" in out.stderr


def test_a_command_that_cannot_be_started_on_the_login_node_is_said_with_its_status(tmp_path):
    """The keeper writes why before the status (its output would otherwise die with it, unflushed)."""
    for argv, why in ((["/no/such/program"], "No such file or directory"),
                      (["echo", "\ud800"], "surrogates not allowed")):
        out = side(tmp_path / "root", "run", str(tmp_path), "--", *argv)
        assert out.returncode == 127 and b"error: cannot run " in out.stderr and why.encode() in out.stderr, out


def test_a_laptops_project_is_sent_with_what_include_names_and_says_what_stays_behind(tmp_path, monkeypatch, capsys):
    """A project's snapshot from a laptop holds what it would hold on the login node: git's files and the
    `include` globs' (data that git ignores); what stays behind is said."""
    project = tmp_path / "nano"
    (project / "data").mkdir(parents=True)
    (project / ".gitignore").write_text("*.bin\n")
    (project / "train.py").write_text("")
    (project / "data" / "train.bin").write_bytes(b"\x00\x01")
    (project / "data" / "val.bin").write_bytes(b"\x02")
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    subprocess.run(["git", "-C", str(project), "add", "."], check=True)
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\ncommand: {argv: [python, train.py], project: nano, include: [data/train.bin]}\n")
    sent = {}
    monkeypatch.setattr(laptop, "send_tree", lambda conn, name, files, record=None: sent.update(
        {path: data for path, data, _ in files}) or 0)
    conn = type("Conn", (), {"root": "/remote", "login": type("Login", (), {"host": "login"})})()
    there = laptop._spec_there(conn, spec).decode()
    assert sorted(sent) == [".gitignore", "data/train.bin", "train.py"] and "project: /remote/trees/" in there
    assert "left out, as git does not track them: data/;" in capsys.readouterr().err  # (val.bin, in it)
