"""What the page asks of a work directory, answered through the library (api.py) as JSON-ready values: the sweeps,
a sweep's status (the document of `status --json`, one source), its runs' metrics as series and a run's log.

A refresh costs what `status` costs (Slurm asked for the whole sweep at once) plus the metrics files
that changed since the last refresh: each run's series is kept with the size and time of the file it was read
from, and read again only when they change.
"""

from __future__ import annotations

import math
import os
import re
import threading
from pathlib import Path
from typing import Any

from tinygpt.launch import api
from tinygpt.launch.errors import LaunchError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=-]*")  # a sweep's name as a URL gives it (its folder under jobs/)
LOG_LINES = 400  # the end of a run's log that its view shows


class NotFound(LaunchError):
    """A sweep or a run the work directory does not have."""


class Reader:
    """The page's questions over one work directory; safe to ask from the server's threads at once."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir.resolve()
        self._series: dict[str, tuple[tuple[int, int], dict[str, list[list[float | None]]]]] = {}  # by metrics file
        self._lock = threading.Lock()

    def sweeps(self) -> dict[str, Any]:
        return {"workdir": str(self.workdir), "sweeps": [e.model_dump() for e in api.list_sweeps(self.workdir)]}

    def sweep(self, name: str) -> api.Sweep:
        manifest = self.workdir / "jobs" / name / "manifest.json"
        if not NAME.fullmatch(name) or not manifest.is_file():
            raise NotFound(f"no sweep `{name}` under {self.workdir}")
        return api.Sweep(manifest)

    def status(self, name: str) -> dict[str, Any]:
        return self.sweep(name).status().model_dump()

    def metrics(self, name: str, runs: list[str] | None = None) -> dict[str, dict[str, Any]]:
        """Each run's last point of every numeric value its metrics.jsonl records ({run: {metric: [step, value]}});
        with `runs`, those runs' whole series instead ({run: {metric: [[step, value], ...]}}): what the page
        draws, a few curves of a sweep that may have thousands of runs."""
        sweep = self.sweep(name)
        if runs is None:
            return {r.name: {k: points[-1] for k, points in self._run_series(Path(r.out_dir)).items()}
                    for r in sweep.manifest.runs}
        if unknown := sorted(set(runs) - set(sweep.runs)):
            raise NotFound(f"no run {', '.join(map(repr, unknown))} in sweep `{name}`")
        return {r.name: self._run_series(Path(r.out_dir)) for r in sweep.manifest.runs if r.name in runs}

    def log(self, name: str, run: str) -> dict[str, Any]:
        sweep = self.sweep(name)
        if run not in sweep.runs:
            raise NotFound(f"no run `{run}` in sweep `{name}`")
        logs = sweep.logs(run)
        return {"run": run, "logs": [{"job": log.job, "path": str(log.path),
                                      "text": "\n".join(log.text.splitlines()[-LOG_LINES:])} for log in logs]}

    def _run_series(self, run_dir: Path) -> dict[str, list[list[float | None]]]:
        from tinygpt.training import metrics

        path = metrics.of_run(run_dir)
        try:
            stat = os.stat(path)
        except OSError:
            return {}
        seen = (stat.st_size, stat.st_mtime_ns)
        with self._lock:
            kept = self._series.get(str(path))
        if kept is not None and kept[0] == seen:
            return kept[1]
        series = {k: [[s, v if math.isfinite(v) else None] for s, v in points]  # (JSON has no NaN: a gap)
                  for k, points in metrics.series(metrics.read(path)).items()}
        with self._lock:
            self._series[str(path)] = (seen, series)
        return series
