"""A program's progress from the lines it prints (spec/command.py's `progress`), for a program that writes no JSON:
each line passed on to the task's log as it comes, and each match of a pattern a record of its named groups in the
run's metrics.jsonl (`{"step": 30, "train_loss": 3.3057, "val_loss": 3.3877, "time": ...}`), what `status`,
`report`, an Optuna search and the retry summary read.

Read here, on the node, as the program prints, rather than by `status` from the log: a record is there for every
reader at once (the Optuna worker beside the program too), a requeued life's lines are never read twice, and
`status` on a 10,000-run sweep reads small files, not logs. The cost: the program's output goes through a pipe, so
it is told PYTHONUNBUFFERED=1 (a Python program would otherwise hold its lines back in a buffer), and this process
reads each line once.
"""

from __future__ import annotations

import json
import math
import re
import sys
import threading
import time
from pathlib import Path
from typing import IO

from tinygpt.base import durable
from tinygpt.training import metrics

JOIN_S = 10.0  # after the program ends, how long its lines may still come (a child of it holding the pipe)


class Reader:
    """Passes `stream`'s lines on to this process's stdout and records each match of `patterns` (in a thread)."""

    def __init__(self, stream: IO[bytes], patterns: list[str], run_dir: Path):
        self.patterns = [re.compile(p) for p in patterns]
        self.matched = [0] * len(self.patterns)
        self.record_to = metrics.of_run(run_dir)
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream: IO[bytes]) -> None:
        out = sys.stdout.buffer
        for line in iter(stream.readline, b""):
            out.write(line)
            out.flush()
            self.take(line.decode("utf-8", "replace"))

    def take(self, line: str) -> None:
        for i, pattern in enumerate(self.patterns):
            if (found := pattern.search(line)) is not None and (record := _record(found)) is not None:
                self.matched[i] += 1
                durable.append_line(self.record_to, json.dumps({**record, "time": time.time()}))

    def finish(self) -> list[str]:
        """Once the program has ended: its last lines read; what to say of each pattern that matched no line."""
        self.thread.join(JOIN_S)
        return [f"tinygpt: command.progress[{i}] matched no line the program printed in this life; check it against "
                f"its log" for i, n in enumerate(self.matched) if n == 0]


def _record(found: re.Match) -> dict | None:
    """A match's named groups as numbers (the step a whole one); None when one is no number."""
    record = {}
    for name, text in found.groupdict().items():
        try:
            record[name] = int(text) if name == "step" else float(text)
        except (TypeError, ValueError):
            return None
        if not math.isfinite(record[name]):
            return None
    return record
