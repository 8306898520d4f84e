"""`metrics.jsonl`: a run's record, one JSON object per line, every line with `step`.

It is the source of truth for everything that looks at a run afterwards (status, reports, benchmarks).
Only rank 0 writes. A resumed run first drops the lines past its checkpoint's step, so that a step
redone after a crash appears once. Experiment trackers (`tinygpt/training/tracking.py`) are sinks beside the
file: every record written goes to each of them too. `read` is the one reader: a line that is not a
whole record (a process killed mid-line, a damaged disk) is skipped, never fatal.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tinygpt.base import durable

FILE_NAME = "metrics.jsonl"  # in the run directory


def of_run(run_dir: str | Path) -> Path:
    """The run directory's metrics file."""
    return Path(run_dir) / FILE_NAME


# The fields readers rely on, and the type each must have when present (a number: int or float, not bool).
NUMBERS = ("train_loss", "val_loss", "lr", "tokens_per_s", "elapsed_s", "train_s", "mfu", "best_val_loss",
           "loss_scale")


def parse(line: str | bytes) -> dict | None:
    """The record on one line, or None when the line is not one: not JSON, not an object, no whole
    number `step` of at least 0, or a known field of the wrong type."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    step = record.get("step")
    if type(step) is not int or step < 0:
        return None
    for key in NUMBERS:
        value = record.get(key)
        if value is not None and type(value) not in (int, float):
            return None
    if not isinstance(record.get("event", ""), str):
        return None
    return record


def read(path: str | Path) -> list[dict]:
    """Every whole record in the file, in order; [] when there is no file or it cannot be read. Each line
    that is not a record is said once (file and line) on stderr, but for a last line without its line
    break, which may be being written."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return []
    records = []
    try:  # (a str is parsed faster than bytes, which json must first decode line by line)
        lines: list[str] | list[bytes] = data.decode().split("\n")
    except UnicodeDecodeError:  # (a damaged line: each decoded alone, and one that is not UTF-8 is no record)
        lines = data.split(b"\n")
    for number, line in enumerate(lines, start=1):
        record = parse(line)
        if record is not None:
            records.append(record)
        elif line.strip() and number < len(lines) and (str(path), number) not in _WARNED:
            _WARNED.add((str(path), number))
            print(f"warning: {path} line {number} is not a metrics record ({line[:60]!r}); skipped",
                  file=sys.stderr)
    return records


_WARNED: set[tuple[str, int]] = set()  # (file, line) said already by this process


class MetricsLog:
    def __init__(self, path: Path, enabled: bool, sinks: list | None = None):
        self.path = path
        self.enabled = enabled
        self.sinks = list(sinks or [])

    def truncate_after(self, step: int) -> None:
        """Drop lines past `step` (a run that died after its last checkpoint logged steps it will redo),
        and lines that are not whole records."""
        if not self.enabled:
            return
        if step == 0:
            self.path.unlink(missing_ok=True)
            return
        if not self.path.exists():
            return
        kept = [r for r in read(self.path) if r["step"] <= step]
        durable.write(self.path, "".join(json.dumps(r) + "\n" for r in kept))

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


def crossing(points: list[dict], target: float, keys: tuple[str, ...] = ("step", "train_s")) -> dict | None:
    """Where a curve of evaluations (records with `val_loss` and `keys`, in step order) first reaches `target`:
    each of `keys` interpolated linearly between the evaluations on either side of it, and `bracket`, the
    distance between those two in steps as a share of the crossing's step; None when it never does."""
    before = None
    for p in points:
        if p["val_loss"] <= target:
            if before is None:  # (reached at the first evaluation: nothing before it to interpolate from)
                return {**{k: p[k] for k in keys}, "bracket": 1.0}
            f = (before["val_loss"] - target) / (before["val_loss"] - p["val_loss"])
            at = {k: before[k] + f * (p[k] - before[k]) for k in keys}
            return {**at, "bracket": (p["step"] - before["step"]) / at["step"]}
        before = p
    return None


NOT_NAMED = ("step", "time", "event")  # (the fields of a record that are not one of its named values)


def series(records: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """Each named number of the records that are not events, as (step, value) points in the order written: what a
    program of the user's writes under any names, as its report draws it and a search reads its metric."""
    found: dict[str, list[tuple[int, float]]] = {}
    for rec in records:
        if "event" in rec or not isinstance(rec.get("step"), int):
            continue
        for key, value in rec.items():
            if key not in NOT_NAMED and isinstance(value, (int, float)) and not isinstance(value, bool):
                found.setdefault(key, []).append((rec["step"], float(value)))  # (a NaN too: a search fails on it)
    return found
