"""`launch.py serve` from a laptop: the server runs on the login node (loopback only, a free port there), and a
port of this machine is forwarded to it over the profile's shared SSH connection; the link printed is this
machine's, with the server's token. Ctrl-C here stops the server there; when the server stops (idle), so does
this, and the forward goes with it.

The forward is OpenSSH's own (`ssh -O forward -L`, on the connection the command already holds): nothing listens
on the login node but the server itself, and on this machine only its loopback.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
from typing import TYPE_CHECKING

from tinygpt.launch.errors import LaunchError
from tinygpt.launch.remote.laptop import connect, launcher_python, launcher_there, send_code
from tinygpt.launch.serve import server

if TYPE_CHECKING:
    from tinygpt.launch.remote.laptop import Connection, Target


def serve(target: Target, args: argparse.Namespace) -> int:
    """Run `serve` on the login node for the sweeps this laptop launched there (or one sweep's page, when the
    command named its spec), forwarding `args.port` here (0: the server's own number when free, else any)."""
    conn, hello = connect(target.login)
    env, words = launcher_there(conn, launcher_python(conn, hello), send_code(conn)[0])
    sweep = [f"{conn.root}/jobs/{target.record_path.parent.name}/manifest.json"] if target.record else []
    forward = Forward(conn, args.port)
    try:
        return conn.stream("run", conn.root, *env, "--", *words, "serve", *sweep, "--workdir", conn.root,
                           "--idle-minutes", f"{args.idle_minutes:g}", shown=forward.line)
    finally:
        forward.close()


class Forward:
    """Reads the server's output as it comes: opens the forward when the link appears, prints this machine's."""

    def __init__(self, conn: Connection, port: int) -> None:
        self.conn, self.port, self.spec = conn, port, None

    def line(self, said: bytes) -> bytes:
        text = said.decode(errors="replace")
        if text.startswith(server.FROM_A_LAPTOP):
            return b""  # (the hint to forward by hand: done here)
        found = server.URL.search(text) if self.spec is None else None
        if found is None:
            return said
        there = int(found[1])
        here = self.port or (there if _free(there) else _free(0))
        self._open(f"127.0.0.1:{here}:127.0.0.1:{there}")
        return (f"serving the sweeps of {self.conn.where}:{self.conn.root} at http://127.0.0.1:{here}{found[2]}\n"
                f"  (a port of this machine, forwarded over SSH to port {there} of the login node)\n").encode()

    def _open(self, spec: str) -> None:
        done = self._ssh("forward", spec)
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip() or f"ssh exited with {done.returncode}"
            raise LaunchError(f"--port {self.port}: the forward to the login node's server could not be opened "
                              f"({said}); the server there is stopped. Give another --port, or 0 for a free one")
        self.spec = spec

    def close(self) -> None:
        if self.spec is not None:
            self._ssh("cancel", self.spec)
            self.spec = None

    def _ssh(self, action: str, spec: str) -> subprocess.CompletedProcess:
        return subprocess.run(["ssh", *self.conn.options, "-O", action, "-L", spec, "--", self.conn.login.host],
                              capture_output=True, timeout=60)


def _free(port: int) -> int:
    """`port` when nothing of this machine listens on it (0: a free one's number), else 0."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return 0
        return s.getsockname()[1]
