"""Test-only: with this folder first on PYTHONPATH, every lock of an Optuna journal (launch/node/study_journal.py's)
is held $TINYGPT_TEST_LOCK_STALL_S seconds longer once taken, and the holder's pid is in `<lock file>.holder`
meanwhile: a kill aimed at a holder surely lands while it holds (Python imports `sitecustomize` as it
starts). Only this file knows of it: tinygpt itself reads no test switch.
"""

import os
import time

_STALL_S = float(os.environ.get("TINYGPT_TEST_LOCK_STALL_S", "0") or 0)

if _STALL_S > 0:
    from optuna.storages.journal import JournalFileOpenLock

    _acquire = JournalFileOpenLock.acquire

    def _stalling_acquire(self) -> bool:
        taken = _acquire(self)
        holder = self._lock_file + ".holder"
        with open(holder, "w") as fh:
            fh.write(str(os.getpid()))
        time.sleep(_STALL_S)
        os.unlink(holder)
        return taken

    JournalFileOpenLock.acquire = _stalling_acquire
