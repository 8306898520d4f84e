"""One owner per run directory: a trainer holds `<out_dir>/.lock` from before it touches anything there
until it ends.

The lock is the kernel's (`flock`) on that file, so it goes with its process: a trainer killed with
SIGKILL, or on a node that died, holds nothing, and the next start (a requeue, or the same command run
again) takes it at once. The file also says who holds it (host, pid, Slurm job, since when), so that a
second trainer on the same directory stops with a message naming the holder and the way out, instead of
interleaving its checkpoints and metrics with the first one's.

Some cluster filesystems do not take `flock` at all (the call fails with ENOLCK or EOPNOTSUPP). There the
holder's record decides: a holder on this host whose process is gone, or an older life of the same Slurm
job (Slurm starts a requeued job only after ending the previous one), is taken over; any other record is
a live holder unless it has not been refreshed for `STALE_S` (the holder refreshes it every `REFRESH_S`).
Two starts in the very same instant are not told apart there; on filesystems that take flock they are.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import threading
import time
from pathlib import Path

from tinygpt.training.preemption import restart_count, slurm_job_id

LOCK_NAME = ".lock"
REFRESH_S = 30.0
STALE_S = 120.0


class RunDirBusy(RuntimeError):
    """Another live trainer owns the run directory; shown without a traceback."""


class _Held(Exception):
    """The lock is someone else's (their record attached); `RunDirLock.acquire` retries or says who."""

    def __init__(self, holder: dict):
        self.holder = holder


def _me() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "slurm_job": slurm_job_id(),
            "restart": restart_count(), "since": time.time()}


def describe(holder: dict) -> str:
    """Who holds a lock, from its record: pid, host, Slurm job, since when."""
    job = f", Slurm job {holder['slurm_job']}" if holder.get("slurm_job") else ""
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0)))
    return f"pid {holder.get('pid')} on {holder.get('host')}{job}, since {since}"


def _busy(out_dir: Path, holder: dict) -> RunDirBusy:
    way_out = f"scancel {holder['slurm_job']}" if holder.get("slurm_job") else f"kill {holder.get('pid')}"
    return RunDirBusy(f"out_dir: {out_dir} is in use by another trainer ({describe(holder)}); wait for it to "
                      f"end, stop it ({way_out}), or give this run another --out-dir")


class RunDirLock:
    """`with RunDirLock(out_dir):` or acquire()/release(). Raises RunDirBusy when a live trainer holds it.

    busy(out_dir, holder) makes the error for another kind of owner (the launcher locks a sweep's folder);
    wait_s: how long to keep trying before raising it."""

    def __init__(self, out_dir: str | Path, busy=_busy, wait_s: float = 0.0):
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / LOCK_NAME
        self.busy, self.wait_s = busy, wait_s
        self.fd: int | None = None
        self._stop = threading.Event()
        self._refresher: threading.Thread | None = None

    def acquire(self) -> RunDirLock:
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                return self._try()
            except _Held as held:
                if time.monotonic() >= deadline:
                    raise self.busy(self.out_dir, held.holder) from None
            time.sleep(0.1)

    def _try(self) -> RunDirLock:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            raise _Held(holder) from None
        except OSError as err:
            if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                os.close(fd)
                raise
            self._without_flock(fd)  # this filesystem takes no flock: the record decides
        self.fd = fd
        _write(fd, _me())
        return self

    def _without_flock(self, fd: int) -> None:
        holder = _read(fd)
        if holder and not _gone(holder, os.fstat(fd).st_mtime):
            os.close(fd)
            raise _Held(holder)
        self._refresher = threading.Thread(target=self._refresh, daemon=True, name="tinygpt-lock-refresh")
        self._refresher.start()

    def _refresh(self) -> None:
        while not self._stop.wait(REFRESH_S):
            os.utime(self.path)

    def release(self) -> None:
        if self.fd is None:
            return
        self._stop.set()
        _write(self.fd, {})  # nobody holds it now
        os.close(self.fd)  # (and the flock with it)
        self.fd = None

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _gone(holder: dict, refreshed_at: float) -> bool:
    """Whether a holder's record (on a filesystem without flock) belongs to a process that has ended."""
    me = _me()
    if holder.get("host") == me["host"]:
        try:
            os.kill(int(holder["pid"]), 0)
        except ProcessLookupError:
            return True
        except (PermissionError, KeyError, ValueError, TypeError):
            pass
    if holder.get("slurm_job") and holder["slurm_job"] == me["slurm_job"] and \
            isinstance(holder.get("restart", 0), int) and holder.get("restart", 0) < me["restart"]:
        return True  # an older life of this very job: Slurm ended it before starting this one
    return time.time() - refreshed_at > STALE_S


def _read(fd: int) -> dict:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        record = json.loads(os.read(fd, 65536) or b"{}")
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}  # (damaged: no holder is known)


def _write(fd: int, record: dict) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)
