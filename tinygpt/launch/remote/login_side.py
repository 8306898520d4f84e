"""The login node's half of working from a laptop (laptop.py is the laptop's half): one program, the standard
library only, that a login node with nothing but a Python 3 runs.

The laptop sends it as the standard input of `PYTHON -`, the one command line the user's login shell parses
(sh, bash, zsh, fish, tcsh and csh all read those words alike), with a last line that calls `main`: the command
and its arguments, and what the command reads (a payload), as Python literals. Nothing of a request ever meets
a shell. Its output follows a line the laptop chose (the marker), on stdout and on stderr, so that what the
login shell's startup files print (a banner) is told apart and dropped.

    hello ROOT                  makes ROOT; says the Python, the platform and the home the laptop must know
    missing ROOT                of the hashes in the payload (JSON), those whose contents ROOT/objects lacks
    receive ROOT                contents from the payload (`HASH SIZE` lines, each followed by its bytes), stored
    tree ROOT NAME              ROOT/trees/NAME from the payload's JSON {files: [[path, kind, hash or link]], record}
    venv ROOT WHEELS REQ...     ROOT/venvs/WHEELS: a venv with REQ installed from the wheels in ROOT/trees/WHEELS
                                (says nothing when neither is there yet)
    run ROOT CWD [K=V...] -- ARGV...   ARGV run apart from this connection; its output and status streamed back
    signal ROOT ID              SIGINT to command ID's process group (Ctrl-C on the laptop)
    pack ROOT PATTERN...        a tar.gz of the files under ROOT that match the glob PATTERNs, on stdout

ROOT and what the launcher makes in it are the user's alone (umask 077); a ROOT, or a folder of the launcher's
in it, that another user can write is refused before anything is read or written (a planted object or tree would
run in the user's jobs), a group-writable one unless the profile trusts the group (login.trust_group).

Everything it writes takes its name only once complete (a temporary name, then a rename), so an interrupted
transfer leaves nothing that a later one would trust. A command started by `run` lives in a session of its own,
its output in files: a dropped connection stops only the streaming, never the command.
"""

import base64
import errno
import glob
import hashlib
import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time

FULL = (errno.ENOSPC, errno.EDQUOT)
RECORD = "SNAPSHOT.json"  # (snapshot.RECORD: a code tree's record, which makes it a snapshot the launcher reuses)
OURS = ("objects", "trees", "venvs", "commands", "jobs", "runs", "logs", "data")  # (the launcher's folders in ROOT)
INTERRUPT = "interrupt"  # (in a command's folder: the laptop asked for a Ctrl-C, which its keeper passes on)
ROOT, PAYLOAD, TRUST_GROUP = "", b"", False  # (the request's: main sets them)


class Refused(Exception):
    """A problem to say on one line, with its fix."""


def _disk(err, where):
    if err.errno in FULL:
        return Refused(f"the login node's disk (or your quota) is full at {where} ({err.strerror}); free some "
                       f"space there (old sweeps, {ROOT}/trees) and try again: nothing was submitted")
    return Refused(f"cannot write {where} on the login node ({err.strerror}); check login.remote_dir in the profile")


def _within(root, name):
    path = os.path.normpath(os.path.join(root, name))
    if os.path.isabs(name) or path == root or not path.startswith(root + os.sep):
        raise Refused(f"{name!r} is not a path inside {root}")
    return path


def _commit(tmp, final):
    """Give a complete temporary file or folder its name; another one that got there first is as good."""
    try:
        os.rename(tmp, final)
    except OSError:
        if not os.path.exists(final):
            raise
        shutil.rmtree(tmp, ignore_errors=True) if os.path.isdir(tmp) else os.unlink(tmp)


def hello(args):
    os.makedirs(os.path.join(ROOT, "objects"), exist_ok=True)
    for name in OURS:  # (those an earlier launcher made open to all: its own, so made private)
        path = os.path.join(ROOT, name)
        if os.path.isdir(path) and os.lstat(path).st_uid == os.getuid() and not TRUST_GROUP:
            os.chmod(path, 0o700)
    libc = os.confstr("CS_GNU_LIBC_VERSION") if "CS_GNU_LIBC_VERSION" in os.confstr_names else ""
    json.dump({"python": "{}.{}".format(*sys.version_info[:2]), "implementation": sys.implementation.name,
               "platform": sysconfig.get_platform(), "glibc": libc.split()[-1] if libc else None,
               "root": ROOT, "home": os.path.expanduser("~")}, sys.stdout)


def missing(args):
    wanted = json.loads(PAYLOAD)
    json.dump([h for h in wanted if not os.path.exists(os.path.join(ROOT, "objects", h))], sys.stdout)


def receive(args):
    objects = os.path.join(ROOT, "objects")
    stream = io.BytesIO(PAYLOAD)
    count = 0
    while True:
        header = stream.readline()
        if not header:
            break
        digest, size = header.decode().split()
        data = stream.read(int(size))
        if len(data) != int(size) or hashlib.sha256(data).hexdigest() != digest:
            raise Refused(f"a file arrived damaged or cut short ({digest}); nothing was submitted: try again")
        fd, tmp = tempfile.mkstemp(dir=objects, prefix=".in-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o400)
        _commit(tmp, os.path.join(objects, digest))
        count += 1
    print(count)


def tree(args):
    name, = args
    trees = os.path.join(ROOT, "trees")
    final = _within(trees, name)
    if os.path.isdir(final):
        return
    spec = json.loads(PAYLOAD)
    os.makedirs(trees, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=trees, prefix=".in-")
    for path, kind, what in spec["files"]:
        target = _within(tmp, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if kind == "link":
            os.symlink(what, target)
        else:
            os.link(_stored(what, kind), target)
    if spec.get("record") is not None:
        with open(os.path.join(tmp, RECORD), "w") as fh:
            json.dump(spec["record"], fh, indent=1)
    _commit(tmp, final)


def _stored(digest, kind):
    """The store's file of a content: read-only, and executable for an `exec` file (a hard link shares modes)."""
    plain = os.path.join(ROOT, "objects", digest)
    if not os.path.isfile(plain):
        raise Refused(f"the content {digest} never arrived; nothing was submitted: try again")
    if kind != "exec":
        return plain
    if not os.path.exists(plain + ".x"):
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(plain), prefix=".in-")
        os.close(fd)
        shutil.copyfile(plain, tmp)
        os.chmod(tmp, 0o500)
        _commit(tmp, plain + ".x")
    return plain + ".x"


def venv(args):
    wheels, requirements = args[0], args[1:]
    venvs = os.path.join(ROOT, "venvs")
    final = _within(venvs, wheels)
    if os.path.isfile(os.path.join(final, "bin", "python")):
        print(final)
        return
    wheels = _within(os.path.join(ROOT, "trees"), wheels)
    if not os.path.isdir(wheels):
        return  # (nothing said: the laptop sends the wheels, then asks again)
    os.makedirs(venvs, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=venvs, prefix=".in-")
    pip = glob.glob(os.path.join(wheels, "pip-*.whl"))  # (pip runs from its wheel: no ensurepip needed here)
    for step in ([sys.executable, "-m", "venv", "--without-pip", tmp],
                 [os.path.join(tmp, "bin", "python"), os.path.join(pip[0] if pip else "pip.whl", "pip"), "install",
                  "--quiet", "--no-index", "--disable-pip-version-check", "--find-links", wheels, *requirements]):
        done = subprocess.run(step, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            said = done.stdout.decode(errors="replace").strip().splitlines()[-3:]
            raise Refused("could not set up the launcher's Python on the login node ({}: {})".format(
                " ".join(step[:4]), " / ".join(said) or "no output"))
    _private(tmp)
    # (a venv finds its packages from where its python is, so the finished one may take its final name)
    _commit(tmp, final)
    print(final)


def _private(top):
    """What pip installed with the wheels' own modes (files 0644), for the user alone, as the rest of ROOT."""
    for folder, names, files in os.walk(top):
        for name in names + files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) & 0o700)


def run(args):
    cwd, rest = args[0], args[1:]
    cut = rest.index("--")
    env = dict(os.environ, PYTHONUNBUFFERED="1", TINYGPT_LOGIN_NODE="1")
    env.update(pair.split("=", 1) for pair in rest[:cut])
    argv = rest[cut + 1:]
    commands = os.path.join(ROOT, "commands")
    os.makedirs(commands, exist_ok=True)
    where = tempfile.mkdtemp(dir=commands, prefix=time.strftime("%Y%m%d-%H%M%S-"))
    out, err = (open(os.path.join(where, n), "wb") for n in ("out", "err"))
    keeper = os.fork()
    if keeper == 0:
        try:
            _keep(where, argv, cwd, env, out, err)
        finally:
            os._exit(0)
    out.close()
    err.close()
    with open(os.path.join(where, "keeper"), "w") as fh:
        fh.write(str(keeper))
    print(os.path.basename(where), flush=True)  # (the command's id, for `signal`: the laptop's first line)
    _stream(where, keeper)


def _keep(where, argv, cwd, env, out, err):
    """The keeper: leads a session of its own, so that the connection's end does not end the command; writes
    the command's exit status when it ends."""
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (Ctrl-C is meant for the command, in the same group)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=devnull, stdout=out, stderr=err,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        code = _wait_passing_interrupt(proc, where)
    except (OSError, ValueError) as e:  # (ValueError: a word no file system encoding can pass to a program)
        err.write(f"error: cannot run {argv[0]} on the login node ({getattr(e, 'strerror', None) or e})\n".encode())
        err.flush()  # (before the status: the laptop reads the output until the status is there; _exit flushes nothing)
        code = 127
    with open(os.path.join(where, "status.tmp"), "w") as fh:
        fh.write(str(128 - code if code < 0 else code))
    os.rename(os.path.join(where, "status.tmp"), os.path.join(where, "status"))


def _wait_passing_interrupt(proc, where):
    """The command's exit status. The laptop's Ctrl-C (`signal` leaves a file) is passed on by the keeper, once,
    to the command's group: the command has started by then, so it is never lost to a command not yet started."""
    sent = False
    while True:
        try:
            return proc.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            if not sent and os.path.exists(os.path.join(where, INTERRUPT)):
                os.killpg(os.getpgrp(), signal.SIGINT)  # (the keeper ignores it; the command and its children not)
                sent = True


def _stream(where, keeper):
    """Copy the command's output as it grows, until its status is written; then exit with that status."""
    sources = [(open(os.path.join(where, n), "rb"), s) for n, s in (("out", sys.stdout), ("err", sys.stderr))]
    status = os.path.join(where, "status")
    while True:
        done = os.path.exists(status)  # (read before the last copy: nothing written before it is missed)
        for fh, sink in sources:
            chunk = fh.read()
            if chunk:
                sink.buffer.write(chunk)
                sink.buffer.flush()
        if done:
            with open(status) as fh:
                sys.exit(int(fh.read()))
        if os.waitpid(keeper, os.WNOHANG)[0] and not os.path.exists(status):
            raise Refused("the command was killed on the login node before it could say how it ended")
        time.sleep(0.05)


def signal_command(args):
    """The laptop's Ctrl-C for a command `run` started: asked of its keeper, which passes it on (_keep)."""
    name, = args
    with open(os.path.join(_within(os.path.join(ROOT, "commands"), name), INTERRUPT), "w"):
        pass


def pack(args):
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|gz") as tar:
        for pattern in args:
            for path in sorted(glob.glob(_within(ROOT, pattern))):
                tar.add(_within(ROOT, os.path.relpath(path, ROOT)), arcname=os.path.relpath(path, ROOT))


COMMANDS = {"hello": hello, "missing": missing, "receive": receive, "tree": tree, "venv": venv, "run": run,
            "signal": signal_command, "pack": pack}


def _guard():
    """Refuse ROOT, or a folder of the launcher's in it, that another user could write; None when all is well."""
    for name in ("", *OURS):
        path = os.path.join(ROOT, name) if name else ROOT
        try:  # (ROOT may be a link to the user's folder elsewhere; a folder in it that is a link was planted)
            st = os.stat(path) if not name else os.lstat(path)
        except FileNotFoundError:
            continue
        where = f"{path} (login.remote_dir)" if not name else path
        if name and stat.S_ISLNK(st.st_mode):
            raise Refused(f"{where} is a symbolic link, which the launcher never makes: someone else may have "
                          f"put it there. Nothing was sent; remove it if it is yours, else tell your admins")
        mine = st.st_uid in (os.getuid(), 0) or (TRUST_GROUP and st.st_gid in os.getgroups())
        if st.st_mode & 0o002 or not mine or (st.st_mode & 0o020 and not TRUST_GROUP):
            who = ("every user of the login node" if st.st_mode & 0o002 else
                   f"its owner, uid {st.st_uid}" if not mine else f"group {st.st_gid}")
            trust = "" if st.st_mode & 0o002 or not mine else (
                ", or, if that group is your lab's and it is shared on purpose, set login.trust_group: true in the "
                "profile")
            raise Refused(f"{where} can be changed by {who} (mode {stat.S_IMODE(st.st_mode):04o}): code planted "
                          f"there would run in your jobs, so nothing was sent. Make it yours alone (chmod 700 "
                          f"{path}), or choose another login.remote_dir{trust}")


def main(argv, payload, marker, trust_group=False):
    """Run COMMAND ROOT ARGS... (argv), with what it reads (payload, base64), after the marker line."""
    global ROOT, PAYLOAD, TRUST_GROUP
    os.umask(0o077)  # (what the launcher makes here is the user's alone)
    for stream in (sys.stdout, sys.stderr):
        stream.write(marker + "\n")
        stream.flush()
    command, ROOT, rest = argv[0], os.path.abspath(os.path.expanduser(argv[1])), argv[2:]
    PAYLOAD, TRUST_GROUP = base64.b64decode(payload), trust_group
    try:
        _guard()
        COMMANDS[command](rest)
    except Refused as problem:
        sys.stderr.write(f"error: {problem}\n")
        sys.exit(1)
    except OSError as err:
        sys.stderr.write(f"error: {_disk(err, err.filename or ROOT)}\n")
        sys.exit(1)
