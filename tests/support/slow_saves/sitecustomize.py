"""Test-only: with this folder first on PYTHONPATH, a Python process's writes stall where a test aims a kill or a
signal (Python imports `sitecustomize` as it starts):

- every checkpoint write stalls for $TINYGPT_TEST_SAVE_STALL_S seconds once its bytes are on disk, before the
  file takes its name;
- the first checkpoint write of each process waits, once its bytes are on disk, until the file
  $TINYGPT_TEST_SAVE_GATE exists (at most two minutes): runs that must all be training when a test acts (a
  signal to a task that packs two) wait there for the slowest to start;
- the write of a run's samples.txt waits, once its bytes are on disk, until the file $TINYGPT_TEST_SAMPLE_GATE
  exists (at most two minutes): the test knows the run is there, acts, then opens the gate.

Only this file knows of them: tinygpt itself reads no test switch, so its real path costs nothing.
"""

import os
import time

_STALL_S = float(os.environ.get("TINYGPT_TEST_SAVE_STALL_S", "0") or 0)
_SAMPLE_GATE = os.environ.get("TINYGPT_TEST_SAMPLE_GATE")
_save_gate = os.environ.get("TINYGPT_TEST_SAVE_GATE")  # (None once this process has passed it)


def _wait_for(gate: str) -> None:
    deadline = time.monotonic() + 120
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)


if _STALL_S > 0 or _SAMPLE_GATE or _save_gate:
    _fsync = os.fsync

    def _stalling_fsync(fd: int) -> None:
        global _save_gate
        _fsync(fd)
        try:
            name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            return
        if name.startswith(".step_") and name.endswith(".tmp"):  # checkpoint.py's temporary
            time.sleep(_STALL_S)
            if _save_gate:
                _wait_for(_save_gate)
                _save_gate = None
        if _SAMPLE_GATE and name.startswith(".samples.txt.") and name.endswith(".tmp"):  # durable.py's temporary
            _wait_for(_SAMPLE_GATE)

    os.fsync = _stalling_fsync
