"""`metrics.jsonl`: a run's record, one JSON object per line, every line with `step`.

It is the source of truth for everything that looks at a run afterwards (status, reports, benchmarks).
Only rank 0 writes. A resumed run first drops the lines past its checkpoint's step, so that a step
redone after a crash appears once. Experiment trackers (`tinygpt/tracking.py`) are sinks beside the
file: every record written goes to each of them too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


class MetricsLog:
    def __init__(self, path: Path, enabled: bool, sinks: list | None = None):
        self.path = path
        self.enabled = enabled
        self.sinks = list(sinks or [])

    def truncate_after(self, step: int) -> None:
        """Drop lines past `step`: a run that died after its last checkpoint logged steps it will redo."""
        if not self.enabled:
            return
        if step == 0:
            self.path.unlink(missing_ok=True)
            return
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                if json.loads(line).get("step", 0) <= step:
                    kept.append(line)
            except ValueError:
                continue  # a half-written last line from a killed process
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, self.path)

    def write(self, record: dict) -> None:
        if self.enabled:
            with open(self.path, "a") as fh:
                fh.write(json.dumps(record) + "\n")
            for sink in self.sinks:
                sink.write(record)

    def close(self) -> None:
        """Close the sinks (each flushes what it holds)."""
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            sink.close()
