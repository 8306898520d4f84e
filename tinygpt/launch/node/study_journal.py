"""The journal file that holds a sweep's Optuna study, read so that one damaged line cannot stop the study.

Optuna's JournalFileBackend gives up on the whole study at the first line that is not JSON (a line half
written when a node died, then appended to by another worker). This backend writes as Optuna's does (the
same lock, the same lines) and reads each line on its own: a line that is not a JSON object with one of
Optuna's operation codes is skipped with a warning naming the file and the line, once per process, and
the operations are numbered by the lines that are kept, so the numbering Optuna asks by stays stable. A
last line without its line break is still being written and is read next time, as Optuna does.

Locks: every writer of the journal, and every worker between counting the trials and asking for a new one,
holds a lock that is a file created with O_CREAT | O_EXCL (Optuna's JournalFileOpenLock), not `flock`,
which some cluster filesystems do not honour (NFS mounted without a lock manager, some parallel
filesystems), and not Optuna's default, a symbolic link (reported to corrupt journals on NFS under Slurm,
optuna#5138). A holder that dies leaves its file behind: a waiter that sees the same file, untouched,
for LOCK_GRACE_S takes it over. So a worker killed while it holds a lock delays the others by that long
at most, and a live holder never holds one for more than a journal append or one `ask`.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

# Optuna's operation codes (optuna/storages/journal/_storage.py, JournalOperation): CREATE_STUDY 0 to
# SET_TRIAL_SYSTEM_ATTR 9. Any other code would reach Optuna's `assert False`.
OPERATIONS = range(10)
LOCK_GRACE_S = 30  # (Optuna's own default: a journal append or one `ask` takes well under a second)


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


class TolerantJournal(JournalFileBackend):
    def __init__(self, path: str, warn: Callable[[str], None] = _warn) -> None:
        super().__init__(path, lock_obj=JournalFileOpenLock(path, grace_period=LOCK_GRACE_S))
        self._path, self._warn, self._warned = path, warn, set()

    def read_logs(self, log_number_from: int) -> Iterator[dict[str, Any]]:
        kept = 0
        with open(self._path, "rb") as fh:
            for number, line in enumerate(fh, start=1):
                if not line.endswith(b"\n"):
                    return
                log = self._parse(line)
                if log is None:
                    if number not in self._warned:
                        self._warned.add(number)
                        self._warn(f"{self._path} line {number} is not an Optuna operation ({line[:80]!r}); "
                                   f"skipped (the study goes on without it)")
                    continue
                if kept >= log_number_from:
                    yield log
                kept += 1

    @staticmethod
    def _parse(line: bytes) -> dict[str, Any] | None:
        try:
            log = json.loads(line)
        except ValueError:  # (not UTF-8, or not JSON)
            return None
        ok = isinstance(log, dict) and type(log.get("op_code")) is int and log["op_code"] in OPERATIONS
        return log if ok else None


def storage(path: str, warn: Callable[[str], None] = _warn) -> JournalStorage:
    return JournalStorage(TolerantJournal(path, warn))


@contextlib.contextmanager
def asking(path: str) -> Iterator[None]:
    """Held by a worker from counting the study's trials to asking for a new one, so that the workers never
    start more than the budget together: `<path>.asking.lock`, the journal's kind of lock."""
    lock = JournalFileOpenLock(f"{path}.asking", grace_period=LOCK_GRACE_S)
    lock.acquire()
    try:
        yield
    finally:
        lock.release()
