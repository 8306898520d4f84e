"""The journal file that holds a sweep's Optuna study, read so that one damaged line cannot stop the study.

Optuna's JournalFileBackend gives up on the whole study at the first line that is not JSON (a line half
written when a node died, then appended to by another worker). This backend writes as Optuna's does (the
same lock, the same lines) and reads each line on its own: a line that is not a JSON object with one of
Optuna's operation codes is skipped with a warning naming the file and the line, once per process, and
the operations are numbered by the lines that are kept, so the numbering Optuna asks by stays stable. A
last line without its line break is still being written and is read next time, as Optuna does.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

# Optuna's operation codes (optuna/storages/journal/_storage.py, JournalOperation): CREATE_STUDY 0 to
# SET_TRIAL_SYSTEM_ATTR 9. Any other code would reach Optuna's `assert False`.
OPERATIONS = range(10)


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


class TolerantJournal(JournalFileBackend):
    def __init__(self, path: str, warn: Callable[[str], None] = _warn) -> None:
        super().__init__(path)
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
