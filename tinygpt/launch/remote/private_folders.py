"""The laptop's folders that must be the user's alone: the shared SSH connection's sockets, and the cache of the
launcher's packages that login nodes install.

Whoever controls the folder of a ControlMaster socket can plant a socket there that the user's ssh connects to
as a client, or watch the user's own; whoever can write the wheel cache chooses the code the login node runs. On
a machine with other users (a shared workstation, a login node used as the laptop, a CI runner), a folder someone
else made first, one others can write, or a link, must never be taken. Each is made private (0700) if missing; an
existing one is used only if it is a real folder (not a link) of the user's that no one else can write, and is
made private if others could read it.

The sockets' folder is `$TINYGPT_SSH_SOCKETS` when set, else `$XDG_RUNTIME_DIR/tinygpt-ssh` when that runtime
folder is the user's alone and short enough, else `/tmp/tinygpt-ssh-<uid>`; the cache is
`$XDG_CACHE_HOME/tinygpt-hpc` (default `~/.cache/tinygpt-hpc`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tinygpt.launch.errors import LaunchError

ENV = "TINYGPT_SSH_SOCKETS"
# A socket's path has at most 107 characters (sun_path); ssh names the socket with %C (40 hex characters) and,
# while it opens one, adds 17 more: a folder's path may have at most 107 - 1 - 40 - 17.
LONGEST = 49


def socket_folder() -> Path:
    """The folder for the sockets, private to this user; a LaunchError naming it and the fix when it is not."""
    path = Path(os.environ.get(ENV) or _default())
    own_folder(path, "the folder for the SSH connection's sockets", "take over your connection to the login node",
               f"set {ENV} to a folder only you can use (mode 0700)")
    if len(str(path)) > LONGEST:
        raise LaunchError(f"cluster: {path}, the folder for the SSH connection's sockets, has a path longer than "
                          f"{LONGEST} characters, too long for ssh's sockets; set {ENV} to a shorter one")
    return path


def wheel_cache() -> Path:
    """The cache of the launcher's packages for login nodes, private to this user."""
    path = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tinygpt-hpc"
    own_folder(path, "the cache of the launcher's packages for login nodes",
               "change the code that your login node's launcher runs", "set XDG_CACHE_HOME to a folder of your own")
    return path


def own_folder(path: Path, what: str, danger: str, fix: str) -> None:
    """Make `path` private if missing; else use it only if it is this user's and no one else can write it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as err:
        raise LaunchError(f"cluster: cannot make {path}, {what} ({err.strerror}); {fix}") from None
    if problem := not_private(path):
        raise LaunchError(f"cluster: {path}, {what}, {problem}: another user could {danger} there, so nothing was "
                          f"sent. Remove it if it is yours, or {fix}")
    if stat.S_IMODE(os.lstat(path).st_mode) & 0o077:
        os.chmod(path, 0o700)  # (ours, and no one else could write it: only reading it is taken from them)


def not_private(path: Path) -> str | None:
    """Why `path` is not a folder this user alone may change (a link, another's, writable by others), or None."""
    try:
        st = os.lstat(path)
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    if st.st_uid != os.getuid():
        return f"belongs to another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return f"can be written by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _default() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and len(runtime) + len("/tinygpt-ssh") <= LONGEST and not_private(Path(runtime)) is None \
            and not stat.S_IMODE(os.stat(runtime).st_mode) & 0o077:
        return Path(runtime) / "tinygpt-ssh"
    return Path("/tmp") / f"tinygpt-ssh-{os.getuid()}"  # (not $TMPDIR: its path may be too long for a socket)
