"""Test-only: with this folder first on PYTHONPATH, every checkpoint write of a Python process stalls for
$TINYGPT_TEST_SAVE_STALL_S seconds once its bytes are on disk, before the file takes its name: a kill or
a signal aimed at a save surely lands in one (Python imports `sitecustomize` as it starts).

Only this file knows of it: tinygpt itself reads no test switch, so its real path costs nothing.
"""

import os
import time

_STALL_S = float(os.environ.get("TINYGPT_TEST_SAVE_STALL_S", "0") or 0)

if _STALL_S > 0:
    _fsync = os.fsync

    def _stalling_fsync(fd: int) -> None:
        _fsync(fd)
        try:
            name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            return
        if name.startswith(".step_") and name.endswith(".tmp"):  # checkpoint.py's temporary file
            time.sleep(_STALL_S)

    os.fsync = _stalling_fsync
