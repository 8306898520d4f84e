"""Every command against a cluster reached over SSH: the laptop's half (login_side.py runs on the login node).

A profile with `login:` names the login node. `launch.py SPEC --cluster NAME` then sends the laptop's code
(what a snapshot takes: tracked files as they are now) and the spec, and runs the same command on the login node,
its output shown here and its exit status returned; the login node writes the sweep's files and talks to Slurm,
as when a user logs in. The laptop keeps one small record, `<workdir>/jobs/<sweep>/remote.json`, naming the
cluster, so that `status`, `logs`, `cancel`, `resubmit`, `report`, `sync` and `pull` of that sweep go there too.

- The code travels content-addressed: the login node keeps every content it was sent once, by hash
  (`<remote_dir>/objects/`), and is sent only those it lacks; a tree of links to them is the jobs' snapshot.
- The login node needs only a Python 3: the launcher's own packages (this project's dependencies, none of them
  torch) are downloaded here for its Python and platform, sent as wheels, and installed once into a venv under
  remote_dir. `report` draws with torch, so it runs with the profile's `python`, the jobs' own.
- One SSH connection per command (OpenSSH's ControlMaster), never a prompt (BatchMode), with timeouts; the
  user's ~/.ssh/config applies. The login shell, whichever it is (sh, bash, zsh, fish, tcsh, csh), is handed one
  command line, `PYTHON -`, made of characters none of them reads specially; the request itself (login_side's
  text, the command's words and payload) travels on standard input, as Python, and its answer follows a marker
  line, so that what the login shell's startup files print is dropped.
- Paths in the spec are the cluster's (relative ones start at remote_dir); a relative path that names a file
  here is refused, as the user likely meant this one. `--workdir` is the laptop's: where the record is kept.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import secrets
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tinygpt.base import durable
from tinygpt.base.config import PATH_KEYS
from tinygpt.launch.console import INVOKED_AS, SPEC_AS, said_as
from tinygpt.launch.errors import LaunchError, LoginAway, SshRefused
from tinygpt.launch.layout import REMOTE_RECORD, REPO_ROOT, SUBMISSIONS, SweepDirs
from tinygpt.launch.remote import login_side
from tinygpt.launch.remote.private_folders import socket_folder, wheel_cache
from tinygpt.launch.submit import snapshot

if TYPE_CHECKING:
    from tinygpt.launch.manifest import Manifest
    from tinygpt.launch.spec.profiles import Login, Profile

RECORD = REMOTE_RECORD  # beside where the sweep's manifest would be, on the laptop
RECORD_KEYS = ("profile", "root", "code", "spec", "cluster")  # (see forward: what each names)
CONNECT_TIMEOUT_S = 15
PERSIST_S = 60  # how long the shared connection outlives the command that opened it
CALL_TIMEOUT_S = 600  # one exchange (a transfer, a venv's install) that takes longer is taken as hung
SOURCE = Path(login_side.__file__).read_text()
PULLED = ("runs/{name}/*.md", "runs/{name}/*.png", "runs/{name}/*/metrics.jsonl", "runs/{name}/*/provenance.json",
          "runs/{name}/*/config.yaml")
CHECKPOINTS = ("runs/{name}/*/checkpoints",)


@dataclass(frozen=True)
class Target:
    """Where a command goes: the login node of `profile`, and what the laptop keeps of a sweep there."""

    profile: Profile
    record_path: Path
    record: dict[str, Any] | None  # None: not launched from here yet

    @property
    def login(self) -> Login:
        return self.profile.login


def target(args: argparse.Namespace) -> Target | None:
    """The login node a command goes to, or None: it runs here."""
    if getattr(args, "local", False):
        return None
    if args.command in ("launch", "check"):
        return launch_target(args.spec, args.workdir, args.cluster)
    if args.command == "serve" and args.cluster:  # (the login node's sweeps, whatever was launched from here)
        return serve_target(args.cluster, args.workdir)
    return None if args.spec is None else sweep_target(args.spec, args.workdir)


def launch_target(spec_path: str, workdir: str, cluster: str | None) -> Target | None:
    """The login node a launch of SPEC goes to (`cluster`, else the spec's: a profile with `login:` that is not
    this machine), or None: it runs here."""
    from tinygpt.launch.spec import profiles

    if os.environ.get("TINYGPT_LOGIN_NODE"):  # (login_side's `run` sets it)
        return None
    try:
        cluster = cluster or _spec_cluster(spec_path)
        profile = profiles.load(cluster) if cluster and cluster not in ("local", "auto") else None
    except LaunchError:  # (the launch here names it, with every other problem of the spec)
        return None
    if profile is None or profile.login is None or _is_here(profile.login.host):
        return None
    from tinygpt.launch.spec.sweep import load_name

    return Target(profile, SweepDirs(Path(workdir).resolve(), load_name(spec_path)).jobs / RECORD, None)


def serve_target(cluster: str, workdir: str) -> Target | None:
    """The login node `serve --cluster NAME` serves from, or None: this machine is it."""
    from tinygpt.launch.spec import profiles

    if os.environ.get("TINYGPT_LOGIN_NODE"):  # (login_side's `run` sets it)
        return None
    profile = profiles.load(cluster)
    if profile.login is None:
        raise LaunchError(f"--cluster {cluster}: its profile has no login: section, so there is no login node to "
                          f"serve from; run serve on the cluster itself, or leave --cluster out")
    return None if _is_here(profile.login.host) else Target(profile, Path(workdir), None)


def sweep_target(spec_path: str, workdir: str) -> Target | None:
    """The login node a sweep was launched on from here (its record), or None: its manifest is here."""
    from tinygpt.launch.spec import profiles, sweep

    if os.environ.get("TINYGPT_LOGIN_NODE") or Path(spec_path).name == "manifest.json":
        return None
    path = SweepDirs(Path(workdir).resolve(), sweep.load_name(spec_path))
    if path.manifest.is_file() or not (path.jobs / RECORD).is_file():
        return None
    record = _read_record(path.jobs / RECORD)
    return Target(profiles.load(record["profile"]), path.jobs / RECORD, record)


def _spec_cluster(spec_path: str) -> str | None:
    from tinygpt.base import schema

    data = schema.load_yaml(Path(spec_path), LaunchError)
    cluster = data.get("cluster") if isinstance(data, dict) else None
    return cluster if isinstance(cluster, str) else None


def _is_here(host: str) -> bool:
    """Whether this machine is the login node the profile names (a user who logged in and launched there)."""
    names = {socket.gethostname(), socket.getfqdn()}
    return host in names or host.split(".")[0] in {n.split(".")[0] for n in names}


def _read_record(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_text())
        if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in RECORD_KEYS):
            raise ValueError(f"it is not a mapping with {', '.join(RECORD_KEYS)}")
        return record
    except (OSError, ValueError) as err:
        raise LaunchError(f"{path}: the record of where this sweep was launched is unreadable ({err}); launch it "
                          f"again with --cluster NAME, or delete the file to treat the sweep as this machine's") \
            from None


# ----------------------------------------------------------------------------------------------------
# The connection


def request(command: str, root: str, args: tuple[str, ...] = (), stdin: bytes = b"", trust_group: bool = False,
            marker: str = "") -> bytes:
    """What `PYTHON -` reads on the login node: login_side's text, then the call of its `main` with the command's
    words and payload as Python literals (repr: whatever characters they hold, none is read by a shell)."""
    call = f"\nmain({[command, root, *args]!r}, {base64.b64encode(stdin).decode()!r}, {marker!r}, {trust_group!r})\n"
    return (SOURCE + call).encode()


def answer(output: bytes, marker: bytes) -> bytes | None:
    """What login_side said after its marker line (before it: the login shell's banners), or None: it never ran."""
    before, found, after = output.partition(marker + b"\n")
    return after if found else None


class Connection:
    """OpenSSH's client to one login node: one shared connection, batch mode, the user's ~/.ssh/config."""

    def __init__(self, login: Login):
        self.login = login
        self.root = login.remote_dir  # (absolute once `hello` said where it is)
        sockets = socket_folder()  # (the user's own, or a LaunchError before anything is sent)
        self.options = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
                        "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4",
                        "-o", "ControlMaster=auto", "-o", f"ControlPath={sockets}/%C",
                        "-o", f"ControlPersist={PERSIST_S}"]
        for key, value in login.options.items():
            self.options += ["-o", f"{key}={value}"]
        if login.port:
            self.options += ["-p", str(login.port)]
        if login.identity_file:
            self.options += ["-i", os.path.expanduser(login.identity_file), "-o", "IdentitiesOnly=yes"]
        if login.user:
            self.options += ["-l", login.user]

    @property
    def where(self) -> str:
        return f"{self.login.user + '@' if self.login.user else ''}{self.login.host}"

    def argv(self) -> list[str]:
        """ssh's command: the login shell there runs `PYTHON -` (the profile allows no other characters in it)."""
        return ["ssh", *self.options, "--", self.login.host, f"{self.login.python} -"]

    def close(self) -> None:
        """End the shared connection, if one is open (the next command opens and checks a new one)."""
        subprocess.run(["ssh", *self.options, "-O", "exit", "--", self.login.host], capture_output=True, timeout=60)

    def request(self, command: str, *args: str, stdin: bytes = b"") -> tuple[bytes, bytes]:
        """login_side's COMMAND as `PYTHON -` reads it, and the marker its answer follows."""
        marker = f"tinygpt-login-side-{secrets.token_hex(8)}"
        return request(command, self.root, args, stdin, self.login.trust_group, marker), marker.encode()

    def call(self, command: str, *args: str, stdin: bytes = b"") -> bytes:
        """login_side's COMMAND's output; a LaunchError that says what went wrong, and how to fix it, if it failed."""
        program, marker = self.request(command, *args, stdin=stdin)
        try:
            done = subprocess.run(self.argv(), input=program, capture_output=True, timeout=CALL_TIMEOUT_S)
        except FileNotFoundError:
            raise LaunchError("cluster: working from a laptop needs OpenSSH's client (`ssh`), which is not "
                              "installed here; install it (Debian/Ubuntu: openssh-client)") from None
        except subprocess.TimeoutExpired:
            raise LaunchError(f"cluster: {self.where} did not finish `{command}` in {CALL_TIMEOUT_S} s; nothing was "
                              f"submitted: check the connection and try again") from None
        said = answer(done.stdout, marker)
        if done.returncode != 0 or said is None:
            raise self.failure(done.returncode, done.stderr, marker)
        return said

    def failure(self, status: int, stderr: bytes, marker: bytes) -> LaunchError:
        """What a failed exchange means, as one message with its fix."""
        ours = answer(stderr, marker)
        if ours is not None:  # (login_side ran, and said what went wrong on its last line)
            problem = _last_line(ours.decode(errors="replace"), f"exit status {status}").removeprefix("error: ")
            return LaunchError(f"cluster: on the login node {self.login.host}: {problem}")
        said = stderr.decode(errors="replace")
        return self.ssh_failure(said) if status == 255 else self.never_ran(status, said)

    def ssh_failure(self, said: str) -> LaunchError:
        """What ssh's own failure (its exit status 255) means."""
        last = _last_line(said, "exit status 255")
        host = self.login.host
        if "REMOTE HOST IDENTIFICATION HAS CHANGED" in said:
            return SshRefused(
                f"cluster: the login node {host}'s host key has CHANGED since this laptop last connected: "
                f"either the site reinstalled it or someone is in between. Nothing was sent. Check the new "
                f"key's fingerprint with the site's documentation or its admins; only then remove the old one "
                f"(ssh-keygen -R {host}) and connect once by hand (ssh {self.where})")
        if "Host key verification failed" in said or "No ED25519 host key is known" in said:
            return SshRefused(
                f"cluster: the login node {host}'s host key is not known on this laptop, and a command never "
                f"waits on a question: nothing was sent. Compare its fingerprint with the one the site "
                f"publishes and accept it once by hand: ssh {self.where} (answer yes)")
        if "Permission denied" in said or "Too many authentication failures" in said:
            return SshRefused(
                f"cluster: {host} refused the login of {self.login.user or 'your user'} ({last}); nothing was "
                f"sent. Check login.user and login.identity_file in the profile (or ssh-add the key), and that "
                f"`ssh {self.where}` works by hand")
        if "Could not resolve hostname" in said:
            return SshRefused(f"cluster: login.host {host!r} is not a known host name ({last}); nothing was "
                               f"sent. Check it, or a Host of that name in ~/.ssh/config")
        if any(s in said for s in ("Connection refused", "timed out", "No route to host", "unreachable",
                                   "Connection closed", "Connection reset", "banner exchange")):
            # ("banner exchange": the connection broke before ssh's greeting was answered, as when sshd is
            # throttling new connections (MaxStartups) or a ProxyCommand ends at once)
            return LoginAway(f"cluster: cannot reach the login node {host} ({last}); nothing was sent. Is it "
                               f"up, and the host and port right (a VPN or ProxyJump needed)? Try again later")
        return SshRefused(f"cluster: ssh {self.where} failed ({last}); nothing was sent")

    def never_ran(self, status: int, said: str) -> LaunchError:
        """Why login_side never started: the login shell found no such Python, or would not run a command."""
        python, last = self.login.python, _last_line(said, f"exit status {status}")
        shells_say = ("not found", "unknown command", "no such file")  # (sh, bash, zsh; fish; tcsh, csh)
        if missing := [line for line in said.splitlines() if python in line and any(s in line.lower()
                                                                                    for s in shells_say)]:
            return LaunchError(f"cluster: the login node has no `{python}` (its login shell said: {missing[0]}); set "
                               f"login.python in the profile to a Python 3 there (e.g. /usr/bin/python3)")
        return LaunchError(
            f"cluster: the login shell of {self.where} did not run `{python} -` ({last}): a login shell that runs "
            f"no commands (nologin, a menu, a restricted shell) cannot serve the launcher. Ask the site for a "
            f"shell that runs commands (any of sh, bash, zsh, fish, tcsh, csh), or check that `ssh {self.where} "
            f"{python} -V` works by hand")

    def stream(self, command: str, *args: str, shown: Callable[[bytes], bytes] | None = None) -> int:
        """login_side's COMMAND (`run`) apart from this connection, its output shown as it comes (with `shown`: a
        line at a time, as `shown` rewrites it); Ctrl-C here interrupts it there, and so does a LaunchError that
        `shown` raises, raised once it ended. Returns its exit status."""
        program, marker = self.request(command, *args)
        proc = subprocess.Popen(self.argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        # (a session of its own: the terminal's Ctrl-C reaches this process, not ssh, which must keep streaming)
        errors = _Relay(proc.stderr, marker)
        try:
            proc.stdin.write(program)
            proc.stdin.close()
        except BrokenPipeError:
            pass  # (ssh ended at once: its status and words say why, below)
        ident, interrupted, refused = self._follow(proc, marker, shown)
        status = proc.wait()
        errors.join(timeout=CONNECT_TIMEOUT_S)
        if ident is None and not errors.started:  # (login_side never ran; when it did, it said why itself)
            raise self.failure(status, errors.held, marker)
        if refused is not None:
            raise refused
        if status == 255:
            command = f" (its output: {self.root}/commands/{ident})" if ident else ""
            raise SshRefused(f"cluster: the connection to {self.login.host} was lost; what it was doing goes on "
                              f"there{command}, and `launch.py status` tells how the sweep stands")
        return 130 if interrupted and status == 0 else status

    def _follow(self, proc: subprocess.Popen, marker: bytes,
                shown: Callable[[bytes], bytes] | None) -> tuple[str | None, bool, LaunchError | None]:
        """The command's output shown until it ends there: its id there (None: it never started), whether it was
        interrupted, and what `shown` refused."""
        started, ident, interrupted, refused = False, None, False, None
        while True:
            try:
                if ident is None:  # (the marker line, then the command's id there)
                    line = proc.stdout.readline()
                    if not line:
                        break
                    if started:
                        ident = line.decode(errors="replace").strip()
                        if interrupted:
                            self.call("signal", ident)
                    started = started or line == marker + b"\n"
                    continue
                chunk = proc.stdout.readline() if shown else proc.stdout.read1(65536)
                if not chunk:
                    break
                sys.stdout.buffer.write(shown(chunk) if shown and not refused else chunk)
                sys.stdout.buffer.flush()
            except LaunchError as err:  # (`shown` refused what it read: the command there is stopped, as by Ctrl-C)
                refused, interrupted = err, True
                self.call("signal", ident)
            except KeyboardInterrupt:
                if interrupted:  # (a second Ctrl-C: stop waiting for it to end there)
                    proc.kill()
                    break
                interrupted = True
                if ident:
                    self.call("signal", ident)
        return ident, interrupted, refused


def _last_line(said: str, otherwise: str) -> str:
    lines = [line for line in said.strip().splitlines() if line.strip()]
    return lines[-1] if lines else otherwise


class _Relay(threading.Thread):
    """Copies what follows the marker line on `source` (ssh's stderr) to this stderr as it comes; keeps what
    precedes it (a banner of the login shell's, or its complaint when login_side never ran)."""

    def __init__(self, source: Any, marker: bytes):
        super().__init__(daemon=True)
        self.source, self.marker, self.held, self.started = source, marker + b"\n", b"", False
        self.start()

    def run(self) -> None:
        while not self.started:
            line = self.source.readline()
            if not line:
                return
            self.held += line
            self.started = line == self.marker
        while chunk := self.source.read1(65536):
            sys.stderr.buffer.write(chunk)
            sys.stderr.buffer.flush()


# ----------------------------------------------------------------------------------------------------
# What travels


def send(conn: Connection, contents: dict[str, bytes]) -> int:
    """Send the contents (by their sha256) the login node lacks; the bytes that travelled."""
    lacking = json.loads(conn.call("missing", stdin=json.dumps(sorted(contents)).encode()))
    payload = b"".join(f"{h} {len(contents[h])}\n".encode() + contents[h] for h in lacking)
    if payload:
        conn.call("receive", stdin=payload)
    return len(payload)


def send_tree(conn: Connection, name: str, files: list[tuple[str, bytes, str]], record: dict | None = None) -> int:
    """`<remote_dir>/trees/NAME` on the login node holding `files` (path, bytes, kind); the bytes sent."""
    listing, contents = [], {}  # (a link is listed with where it points; a file by its content's hash, sent once)
    for path, data, kind in files:
        if kind == "link":
            listing.append([path, kind, data.decode("utf-8", "surrogateescape")])
        else:
            digest = hashlib.sha256(data).hexdigest()
            contents[digest] = data
            listing.append([path, kind, digest])
    sent = send(conn, contents)
    conn.call("tree", name, stdin=json.dumps({"files": listing, "record": record}).encode())
    return sent


def launcher_requirements() -> list[str]:
    """This project's own dependencies: what the launcher side imports (torch is the `train` extra's)."""
    from importlib import metadata

    try:
        required = metadata.requires("tinygpt-hpc") or []
    except metadata.PackageNotFoundError:
        raise LaunchError("cluster: the launcher's packages for the login node are this project's dependencies, "
                          "read from its installation, and it is not installed here; run `make venv` (pip install "
                          "-e .)") from None
    return sorted(r for r in required if "extra ==" not in r)


def _wheels(hello: dict[str, Any], requirements: list[str]) -> list[Path]:
    """The wheels of `requirements` for the login node's Python and platform, downloaded here once (cached)."""
    system, _, machine = hello["platform"].partition("-")
    if system != "linux" or hello["implementation"] != "cpython" or not hello["glibc"]:
        raise LaunchError(f"cluster: the login node's Python is {hello['implementation']} {hello['python']} on "
                          f"{hello['platform']}; the launcher's packages are sent for CPython on Linux (glibc) only")
    version, glibc = hello["python"].replace(".", ""), int(hello["glibc"].split(".")[1])
    platforms = [f"manylinux_2_{minor}_{machine}" for minor in range(glibc, 4, -1)]
    platforms += [f"manylinux2014_{machine}", f"linux_{machine}"]
    wanted = ["pip", *requirements]  # (pip installs them there from its wheel: the login node needs no ensurepip)
    key = hashlib.sha256(json.dumps([wanted, version, platforms]).encode()).hexdigest()[:16]
    cache = wheel_cache() / "wheels" / key
    if not (cache / "complete").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--only-binary",
                ":all:", "--dest", str(cache), "--python-version", hello["python"], "--implementation", "cp",
                "--abi", f"cp{version}", "--abi", "abi3", "--abi", "none"]
        for platform in platforms:
            argv += ["--platform", platform]
        print(f"downloading the launcher's packages for the login node (Python {hello['python']}, {machine}): "
              f"{', '.join(requirements)}", file=sys.stderr)
        done = subprocess.run(argv + wanted, capture_output=True, text=True)
        if done.returncode != 0:
            said = " / ".join(done.stderr.strip().splitlines()[-2:])
            raise LaunchError(f"cluster: could not download the launcher's packages for the login node ({said}); "
                              f"this laptop needs a package index (or pip's --find-links) for them")
        durable.write(cache / "complete", "\n".join(wanted) + "\n")
    return sorted(cache.glob("*.whl"))


# ----------------------------------------------------------------------------------------------------
# The commands


def connect(login: Login) -> tuple[Connection, dict[str, Any]]:
    """A connection to the login node, and what it said of itself (its Python, platform, remote_dir's path)."""
    conn = Connection(login)
    hello = json.loads(conn.call("hello"))
    conn.root = hello["root"]
    return conn, hello


def send_code(conn: Connection) -> tuple[str, int]:
    """The laptop's code as a snapshot takes it, on the login node: (its digest, the bytes that travelled)."""
    code = snapshot.read(REPO_ROOT)
    sent = send_tree(conn, code.digest, code.contents, code.record(f"{socket.gethostname()}:{REPO_ROOT}"))
    print(f"code {code.digest}: {len(code.contents)} files, {sent:,} bytes sent to {conn.login.host}",
          file=sys.stderr)
    return code.digest, sent


def _spec_there(conn: Connection, spec: Path) -> bytes:
    """The spec as the login node reads it: as it is, but for a command's project (a folder of this laptop's),
    which is sent as a snapshot and named there by its path."""
    from tinygpt.base import schema
    from tinygpt.launch.spec.command import project_root

    data = schema.load_yaml(spec, LaunchError)
    command = data.get("command") if isinstance(data, dict) else None
    if not isinstance(command, dict) or not isinstance(command.get("project"), (str, type(None))):
        return spec.read_bytes()  # (the login node's check names what is wrong with the section)
    root = project_root(command.get("project"), spec)
    if not root.is_dir():
        raise LaunchError(f"{spec}: command.project: {root} is not a folder on this laptop; name the folder of "
                          f"your program (relative to the spec's)")
    include = command.get("include")
    include = tuple(str(p) for p in include) if isinstance(include, list) else ()  # (checked on the login node)
    project = snapshot.read(root, everything=True, include=include)
    sent = send_tree(conn, project.digest, project.contents, project.record(f"{socket.gethostname()}:{root}"))
    print(f"project {project.digest} ({root}): {len(project.contents)} files, {sent:,} bytes sent to "
          f"{conn.login.host}", file=sys.stderr)
    if project.left_out:
        print(f"project: left out, as git does not track them: {', '.join(e.path for e in project.left_out)}; a run "
              f"that reads one needs it in command.include", file=sys.stderr)
    command["project"] = f"{conn.root}/trees/{project.digest}"
    return yaml.safe_dump(data, sort_keys=False).encode()


def launcher_python(conn: Connection, hello: dict[str, Any]) -> str:
    """The launcher's Python on the login node: a venv of this project's dependencies, made there once, named by
    its wheels' file names (a wheel's name says its version and build: PyPI never changes one's contents)."""
    wheels = _wheels(hello, launcher_requirements())
    name = "wheels-" + hashlib.sha256("\0".join(p.name for p in wheels).encode()).hexdigest()[:16]
    made = conn.call("venv", name, *launcher_requirements()).decode().strip()
    if not made:  # (no such venv there, nor its wheels: they are sent, once)
        send_tree(conn, name, [(p.name, p.read_bytes(), "file") for p in wheels])
        made = conn.call("venv", name, *launcher_requirements()).decode().strip()
    return made + "/bin/python"


def launcher_there(conn: Connection, python: str, code: str, module: str = "tinygpt.launch") -> tuple[list[str],
                                                                                                    list[str]]:
    """(environment, words) that start the launcher sent as `code` on the login node: `python -m tinygpt.launch`
    (or another of its modules) with the tree first on its path, a checkout's code and an installed launcher's
    alike."""
    return [f"PYTHONPATH={conn.root}/trees/{code}"], [python, "-m", module]


def sweeps_there(workdir: Path) -> list[dict[str, Any]]:
    """`list --json` of each login node that this laptop launched sweeps of `workdir` on, once per node (its
    launcher sent as this one's code): the entries of those sweeps (by name), or an entry with the problem."""
    records: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for path in sorted((workdir / "jobs").glob(f"*/{RECORD}")):
        if not path.with_name("manifest.json").exists():
            try:
                record = _read_record(path)
            except LaunchError as err:
                records.setdefault("", []).append((path.parent.name, {"problem": str(err)}))
                continue
            records.setdefault(record["profile"], []).append((path.parent.name, record))
    from tinygpt.launch.spec import profiles

    found = [{"sweep": name, "problem": record["problem"]} for name, record in records.pop("", [])]
    for profile, sweeps in records.items():
        try:
            login = profiles.load(profile).login
            if login is None:
                raise LaunchError(f"its profile {profile} has no login: section any more")
            conn, hello = connect(login)
            env, words = launcher_there(conn, launcher_python(conn, hello), send_code(conn)[0])
            said = conn.call("run", conn.root, *env, "--", *words, "list", "--json", "--workdir", conn.root)
            there = {e["sweep"]: e for e in json.loads(said.split(b"\n", 1)[1])["sweeps"]}
        except (LaunchError, ValueError, KeyError, IndexError) as err:
            found += [{"sweep": name, "problem": f"its login node did not say: {err}"} for name, _ in sweeps]
            continue
        found += [{**there.get(name, {"problem": "not on its login node"}), "sweep": name,
                   "where": conn.where} for name, _ in sweeps]
    return found


def run_there(conn: Connection, python: str, code: str, arguments: list[str], spec_as: str | None = None) -> int:
    """The launcher's ARGUMENTS on the login node, in remote_dir, with the code sent as `code`: its exit status."""
    env, words = launcher_there(conn, python, code)
    env += [f"{SPEC_AS}={spec_as}"] if spec_as else []
    env += [f"{INVOKED_AS}={said_as()}"]
    return conn.stream("run", conn.root, *env, *_terminal(), "--", *words, *arguments)


def forward(target_: Target, top: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Run the command on the login node; `launch` and `check` send the code and the spec first."""
    if target_.record is None:
        _check_paths(args.spec, target_)  # (a local problem: said before the login node is asked anything)
    conn, hello = connect(target_.login)
    record = target_.record or _inputs_sent(conn, target_, args.spec)
    if args.command == "pull":
        return _pull(conn, target_.record_path.parent.name, args.workdir, args.checkpoints)
    python = launcher_python(conn, hello)
    if args.command == "report" and target_.profile.python:
        python = target_.profile.python  # (attention maps load the checkpoints: the jobs' Python has torch)
    arguments = _arguments(top, args, spec=record["spec"], cluster=record["cluster"], workdir=conn.root)
    if target_.record is None and args.command == "launch":
        return _launch(conn, python, target_, record, arguments, args.spec)
    status = run_there(conn, python, record["code"], arguments, args.spec)
    if status == 0 and args.command == "report":
        _pull(conn, target_.record_path.parent.name, args.workdir, checkpoints=False)
    return status


def launch_there(target_: Target, spec_path: str, options: list[str]) -> int:
    """`launch.py SPEC --cluster NAME OPTIONS...` from here, as the command does it (the library's `launch`)."""
    _check_paths(spec_path, target_)
    conn, hello = connect(target_.login)
    record = _inputs_sent(conn, target_, spec_path)
    arguments = ["launch", record["spec"], "--cluster", record["cluster"], "--workdir", conn.root, *options]
    return _launch(conn, launcher_python(conn, hello), target_, record, arguments, spec_path)


def _inputs_sent(conn: Connection, target_: Target, spec_path: str) -> dict[str, str]:
    """The code, the spec and the profile sent to the login node; the record of where they are there."""
    code, _ = send_code(conn)
    inputs = [(Path(spec_path).name, _spec_there(conn, Path(spec_path)), "file"),
              (Path(target_.profile.path).name, Path(target_.profile.path).read_bytes(), "file")]
    name = f"inputs-{snapshot.digest(inputs)}"
    send_tree(conn, name, inputs)
    return {"profile": str(Path(target_.profile.path).resolve()), "root": conn.root, "code": code,
            "spec": f"{conn.root}/trees/{name}/{inputs[0][0]}", "cluster": f"{conn.root}/trees/{name}/{inputs[1][0]}"}


def _launch(conn: Connection, python: str, target_: Target, record: dict[str, str], arguments: list[str],
            spec_path: str) -> int:
    """A launch on the login node, its record kept here first (a drop leaves it known), gone if it was refused."""
    target_.record_path.parent.mkdir(parents=True, exist_ok=True)
    durable.write(target_.record_path, json.dumps(record, indent=1) + "\n")
    status = run_there(conn, python, record["code"], arguments, spec_path)
    if status in (1, 2):
        target_.record_path.unlink(missing_ok=True)  # (refused there: nothing was launched)
    return status


@dataclass(frozen=True)
class Library:
    """The library on a login node, ready for a sweep's calls: the connection, and the words that start
    `python -m tinygpt.launch.api` there with this laptop's code (sent once, when it was made)."""

    conn: Connection
    env: list[str]
    words: list[str]

    def call(self, manifest: str, method: str, arguments: dict[str, Any]) -> Any:
        """Sweep(MANIFEST).METHOD(**arguments), made there: its answer as JSON, or its LaunchError raised here, of the
        same kind and words."""
        from tinygpt.launch import errors

        said = self.conn.call("run", self.conn.root, *self.env, "--", *self.words, manifest, method,
                              json.dumps(arguments))
        try:
            found = json.loads(said.split(b"\n", 1)[1])
            if "error" in found:
                kind, message = found["error"]
                raise getattr(errors, kind, LaunchError)(message)
            return found["answer"]
        except (ValueError, KeyError, IndexError, TypeError) as err:
            raise LaunchError(f"cluster: {self.conn.where} answered `{method}` with what is not the library's "
                              f"answer ({err}): {said[-300:]!r}") from None


def library_there(target_: Target, jobs_python: bool = False) -> Library:
    """The library on the login node of a sweep launched from here: the launcher's venv there, or the jobs'
    Python (`report`: its attention maps load checkpoints with torch)."""
    conn, hello = connect(target_.login)
    python = target_.profile.python if jobs_python and target_.profile.python else launcher_python(conn, hello)
    env, words = launcher_there(conn, python, send_code(conn)[0], "tinygpt.launch.api")
    return Library(conn, env, words)


def pull_there(conn: Connection, name: str, workdir: str) -> None:
    """`launch.py pull SPEC`: sweep `name`'s report and its runs' metrics brought back under `workdir`."""
    _pull(conn, name, workdir, checkpoints=False)


def manifest_there(conn: Connection, name: str) -> Manifest:
    """Sweep `name`'s manifest (and its submissions) as the login node has it now, read here."""
    from tinygpt.launch import manifest as manifest_mod

    files = fetch(conn, [f"jobs/{name}/manifest.json", f"jobs/{name}/{SUBMISSIONS}"])
    if f"jobs/{name}/manifest.json" not in files:
        raise LaunchError(f"{conn.where}:{conn.root}/jobs/{name}/manifest.json: no manifest there (removed since the "
                          f"launch?); launch the spec again with --cluster, or delete jobs/{name}/{RECORD} here to "
                          f"forget it")
    with tempfile.TemporaryDirectory() as folder:
        for rel in (f"jobs/{name}/manifest.json", f"jobs/{name}/{SUBMISSIONS}"):
            if rel in files:
                Path(folder, Path(rel).name).write_bytes(files[rel])
        try:
            return manifest_mod.load(Path(folder) / "manifest.json")
        except LaunchError as err:  # (damaged there: said with the login node's path, not this copy's)
            raise LaunchError(str(err).replace(folder, f"{conn.where}:{conn.root}/jobs/{name}")) from None


def _terminal() -> list[str]:
    """What makes the command there write for this terminal (rich reads them): its size, and that it is one, so
    that `status --watch` redraws its table in place. Nothing when the output here is not a terminal."""
    if not sys.stdout.isatty():
        return []
    size = os.get_terminal_size()
    return [f"COLUMNS={size.columns}", f"LINES={size.lines}", "TTY_COMPATIBLE=1", "TTY_INTERACTIVE=1",
            f"TERM={os.environ.get('TERM', 'xterm')}"]


def _arguments(top: argparse.ArgumentParser, args: argparse.Namespace, **given: str | None) -> list[str]:
    """The command's arguments as the login node is to parse them: every option that was given, from the parsed
    values (not the laptop's words), with `given` (the spec, cluster and workdir of the login node) instead."""
    commands = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    positionals, options = [], []
    for action in commands.choices[args.command]._actions:
        value = given[action.dest] if action.dest in given else getattr(args, action.dest, None)
        if isinstance(action, argparse._HelpAction) or value is None or value is False:
            continue
        if not action.option_strings:
            positionals.append(str(value))
        elif value == action.default:
            continue
        elif isinstance(action, argparse._StoreTrueAction):
            options.append(action.option_strings[0])
        elif isinstance(action, argparse._AppendAction):
            options += [f"{action.option_strings[0]}={item}" for item in value]
        else:
            options.append(f"{action.option_strings[0]}={value}")
    # (`--opt=value` and `--` before the positionals: a value that starts with '-' is never read as an option)
    return [args.command, *options, "--", *positionals]


def _check_paths(spec_path: str, target_: Target) -> None:
    """Refuse a relative path in the spec that names a file or folder here: the user likely meant this one,
    while the jobs would read the cluster's."""
    from tinygpt.base import schema

    data = schema.load_yaml(Path(spec_path), LaunchError)
    found: list[str] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                values = value if isinstance(value, list) else [value]
                if key in PATH_KEYS:
                    found.extend(f"{where}{key}: {v}" for v in values if isinstance(v, str) and v
                                 and not os.path.isabs(os.path.expanduser(v)) and os.path.exists(v))
                walk(value, f"{where}{key}.")
        elif isinstance(node, list):
            for item in node:
                walk(item, where)

    walk(data, "")
    if found:
        raise LaunchError([f"{f} is a relative path, and names a file on this laptop; on {target_.profile.name} "
                           f"every path is the cluster's (relative ones start at login.remote_dir, "
                           f"{target_.login.remote_dir}): give the cluster's absolute path (copy the file there "
                           f"first, e.g. with scp)" for f in found], spec_path)


def fetch(conn: Connection, patterns: list[str]) -> dict[str, bytes]:
    """The files under remote_dir that match the glob `patterns`: {path: contents}."""
    program, marker = conn.request("pack", *patterns)
    with tempfile.TemporaryFile() as archive:
        try:
            done = subprocess.run(conn.argv(), input=program, stdout=archive, stderr=subprocess.PIPE,
                                  timeout=CALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise LaunchError(f"cluster: {conn.login.host} did not send the files in {CALL_TIMEOUT_S} s") from None
        archive.seek(0)
        head = archive.read(1 << 20)  # (the marker line, after whatever the login shell printed first)
        found = head.find(marker + b"\n")
        if done.returncode != 0 or found < 0:
            raise conn.failure(done.returncode, done.stderr, marker)
        archive.seek(found + len(marker) + 1)
        with tarfile.open(fileobj=archive, mode="r|gz") as tar:
            return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}


def _pull(conn: Connection, name: str, workdir: str, checkpoints: bool) -> int:
    """Bring back sweep `name`'s report and every run's metrics (and checkpoints), under the laptop's workdir."""
    patterns = [p.format(name=name) for p in PULLED + (CHECKPOINTS if checkpoints else ())]
    here = Path(workdir).resolve()
    files = fetch(conn, patterns)
    for rel, data in files.items():
        path = here / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute() or not rel.startswith(f"runs/{name}/"):
            raise LaunchError(f"pull: the login node sent {rel!r}, outside runs/{name}/; nothing more was written")
        path.parent.mkdir(parents=True, exist_ok=True)
        durable.write(path, data)
    print(f"pulled {len(files)} file(s) of sweep {name} from {conn.login.host} into {here / 'runs' / name}")
    return 0
