"""The folder that holds the shared SSH connection's sockets: the user's own, or none is used.

Whoever controls the folder of a ControlMaster socket can plant a socket there that the user's ssh connects to
as a client, or watch the user's own: on a machine with other users (a shared workstation, a login node used as
the laptop, a CI runner), a folder someone else made first, world-writable or as a link to a folder of theirs,
must never be taken. The folder is `$TINYGPT_SSH_SOCKETS` when set, else `$XDG_RUNTIME_DIR/tinygpt-ssh` when
that runtime folder is the user's alone and short enough, else `/tmp/tinygpt-ssh-<uid>`; it is made private
(0700) if missing, and used only if it is a real folder (not a link) of the user's with no access for others.
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
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as err:
        raise LaunchError(f"cluster: cannot make {path} for the SSH connection's sockets ({err.strerror}); set "
                          f"{ENV} to a folder of your own (mode 0700)") from None
    if problem := not_private(path):
        raise LaunchError(f"cluster: {path}, the folder for the SSH connection's sockets, {problem}: another user "
                          f"could take over your connection to the login node there, so nothing was sent. Remove it "
                          f"if it is yours, or set {ENV} to a folder only you can use (mode 0700)")
    if len(str(path)) > LONGEST:
        raise LaunchError(f"cluster: {path}, the folder for the SSH connection's sockets, has a path longer than "
                          f"{LONGEST} characters, too long for ssh's sockets; set {ENV} to a shorter one")
    return path


def not_private(path: Path) -> str | None:
    """Why `path` is not a folder this user alone may use (a link, another's, open to others), or None."""
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
    if st.st_mode & 0o077:
        return f"is open to other users (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _default() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and len(runtime) + len("/tinygpt-ssh") <= LONGEST and not_private(Path(runtime)) is None:
        return Path(runtime) / "tinygpt-ssh"
    return Path("/tmp") / f"tinygpt-ssh-{os.getuid()}"  # (not $TMPDIR: its path may be too long for a socket)
