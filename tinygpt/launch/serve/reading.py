"""What the page asks of a work directory, answered through the library (api.py) as JSON-ready values: the sweeps,
a sweep's status (the document of `status --json`, one source), the page's view of it, its runs' metrics as series
and a run's log.

A refresh costs what `status` costs (Slurm asked for the whole sweep at once; a metrics file read only when it
changed, a manifest only when it changed) and answers in the size of one page, not of the sweep: PAGE runs of the
table, and the few curves drawn (the best runs by the metric shown, the failed ones, the one chosen), each run's
series kept with the file's size and time and read again only when they change.
"""

from __future__ import annotations

import math
import os
import re
import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from tinygpt.launch import api
from tinygpt.launch.errors import LaunchError
from tinygpt.launch.read.run_states import read_progress
from tinygpt.training.attention import FILE_NAME as ATTENTION

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=-]*")  # a sweep's name as a URL gives it (its folder under jobs/)
LOG_LINES = 400  # the end of a run's log that its view shows
PAGE = 100  # runs a page of the table shows
PLOTTED = 8  # the curves drawn of a large sweep: the best runs by their last value, and as many failed ones
FILE_END = 20_000  # the end of a run's samples.txt that its view shows, in bytes
ATTENTION_MAX = 4_000_000  # a run's attention.json larger than this is not ours (damaged): not read


class NotFound(LaunchError):
    """A sweep or a run the work directory does not have."""


class Reader:
    """The page's questions over one work directory; safe to ask from the server's threads at once."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir.resolve()
        self._sweeps: dict[str, api.Sweep] = {}  # (each keeps its manifest until the file changes)
        self._series: dict[str, tuple[tuple[int, int], dict[str, list[list[float | None]]]]] = {}  # by metrics file
        self._lock = threading.Lock()

    def sweeps(self) -> dict[str, Any]:
        return {"workdir": str(self.workdir), "sweeps": [e.model_dump() for e in api.list_sweeps(self.workdir)]}

    def sweep(self, name: str) -> api.Sweep:
        manifest = self.workdir / "jobs" / name / "manifest.json"
        if not NAME.fullmatch(name) or not manifest.is_file():
            raise NotFound(f"no sweep `{name}` under {self.workdir}")
        with self._lock:
            kept = self._sweeps.get(name)
        if kept is None:
            kept = api.Sweep(manifest)
            with self._lock:
                self._sweeps[name] = kept
        kept.reload()  # (a relaunch may have added runs)
        return kept

    def status(self, name: str) -> dict[str, Any]:
        return self.sweep(name).status().model_dump()

    def view(self, name: str, page: int = 0, metric: str | None = None, run: str | None = None) -> dict[str, Any]:
        """What the sweep's page shows now, in one answer the size of a page: the status document with the runs
        of page `page` only (the counts and notes are the whole sweep's) and an Optuna search's PAGE best trials
        (`trials`: how many it has), `run`'s row, the named values its runs record, the one drawn (`metric`, else
        train_loss, else the first) and the curves drawn."""
        sweep = self.sweep(name)
        if run is not None and run not in sweep.runs:
            raise NotFound(f"no run `{run}` in sweep `{name}`")
        status = sweep.status()
        last = self._last_points(sweep)  # (read by the status just now: no file read twice)
        names = sorted({key for points in last.values() for key in points})
        if metric not in names:
            metric = "train_loss" if "train_loss" in names else names[0] if names else None
        pages = max(1, math.ceil(len(status.runs) / PAGE))
        page = min(max(page, 0), pages - 1)
        trials = None if status.trials is None else sorted(  # (a search minimises its value)
            status.trials, key=lambda t: _best_first(t.value))[:PAGE]
        shown = status.model_copy(update={"runs": status.runs[page * PAGE:(page + 1) * PAGE], "trials": trials})
        drawn = self._drawn(status, last, metric, run)
        out_dir = {r.name: r.out_dir for r in sweep.manifest.runs}
        return {"status": shown.model_dump(), "total": len(status.runs), "page": page, "pages": pages, "per_page": PAGE,
                "trials": None if status.trials is None else len(status.trials),
                "run": next((r.model_dump() for r in status.runs if r.name == run), None),
                "metrics": names, "metric": metric,
                "curves": {r: self._run_series(out_dir[r]).get(metric, []) for r in drawn}}

    def metrics(self, name: str, runs: list[str] | None = None) -> dict[str, dict[str, Any]]:
        """Each run's last point of every numeric value its metrics.jsonl records ({run: {metric: [step, value]}});
        with `runs`, those runs' whole series instead ({run: {metric: [[step, value], ...]}})."""
        sweep = self.sweep(name)
        if runs is None:
            return {run: {k: [s, _finite(v)] for k, (s, v) in points.items()}
                    for run, points in self._last_points(sweep).items()}
        if unknown := sorted(set(runs) - set(sweep.runs)):
            raise NotFound(f"no run {', '.join(map(repr, unknown))} in sweep `{name}`")
        return {r.name: self._run_series(r.out_dir) for r in sweep.manifest.runs if r.name in runs}

    def run(self, name: str, run: str) -> dict[str, Any]:
        """A run's page beside its row: the end of its latest logs, its samples and attention maps (what our
        trainer writes as it ends) and how its latest job used its allocation (sacct, for this run alone)."""
        sweep = self.sweep(name)
        if run not in sweep.runs:
            raise NotFound(f"no run `{run}` in sweep `{name}`")
        record = next(r for r in sweep.manifest.runs if r.name == run)
        logs = [{"job": log.job, "path": str(log.path), "text": "\n".join(log.text.splitlines()[-LOG_LINES:])}
                for log in sweep.logs(run)]
        samples, samples_problem = _file_end(Path(record.out_dir) / "samples.txt")
        attention, attention_problem = _attention(Path(record.out_dir) / ATTENTION)
        efficiency, efficiency_problem = None, None
        if logs:  # (a run that went to Slurm)
            try:
                efficiency = next(iter(sweep.efficiency([run])), None)
            except LaunchError as err:
                efficiency_problem = str(err)
        return {"run": run, "logs": logs, "samples": samples, "attention": attention, "efficiency": efficiency,
                "problems": [p for p in (samples_problem, attention_problem, efficiency_problem) if p]}

    @staticmethod
    def _last_points(sweep: api.Sweep) -> dict[str, dict[str, tuple[int, float]]]:
        return {r.name: read_progress(r.out_dir).get("last", {}) for r in sweep.manifest.runs}

    @staticmethod
    def _drawn(status: Any, last: dict[str, dict[str, tuple[int, float]]], metric: str | None,
               run: str | None) -> list[str]:
        """The runs whose curves are drawn: the PLOTTED best by their last value of `metric` (a NaN last), the
        first PLOTTED that failed, and `run`; those that record `metric`."""
        has = [r for r, points in last.items() if metric in points]
        best = sorted(has, key=lambda r: _best_first(last[r][metric][1]))[:PLOTTED]
        failed = [r.name for r in status.runs if r.failed and metric in last[r.name]][:PLOTTED]
        return list(dict.fromkeys([*best, *failed, *([run] if run and metric in last[run] else [])]))

    def _run_series(self, run_dir: str) -> dict[str, list[list[float | None]]]:
        from tinygpt.training import metrics

        path = os.path.join(run_dir, metrics.FILE_NAME)
        try:
            stat = os.stat(path)
        except OSError:
            return {}
        seen = (stat.st_size, stat.st_mtime_ns)
        with self._lock:
            kept = self._series.get(path)
        if kept is not None and kept[0] == seen:
            return kept[1]
        series = {k: [[s, _finite(v)] for s, v in points] for k, points in metrics.series(metrics.read(path)).items()}
        with self._lock:
            self._series[path] = (seen, series)
        return series


def _file_end(path: Path) -> tuple[str | None, str | None]:
    """The end of a text file a run wrote (FILE_END bytes at most), or None; what went wrong reading it."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - FILE_END))
            return f.read().decode(errors="replace"), None
    except FileNotFoundError:
        return None, None
    except OSError as err:
        return None, f"{path}: cannot be read ({err.strerror})"


class Attention(BaseModel):
    """attention.json as a run writes it (training/attention.py): a head's map is a square over the prompt."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False)  # (JSON has no NaN: a diverged run is not drawn)

    step: int
    prompt: list[str]
    layers: list[list[list[list[float]]]]

    @model_validator(mode="after")
    def _square(self) -> Attention:
        n = len(self.prompt)
        if any(len(head) != n or any(len(row) != n for row in head) for layer in self.layers for head in layer):
            raise ValueError(f"a head's map is not {n} x {n}, the prompt's length")
        return self


def _attention(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The run's attention.json as the page draws it, or None; why a file there is not drawn (damaged)."""
    try:
        if path.stat().st_size > ATTENTION_MAX:
            return None, f"{path}: larger than a run writes ({ATTENTION_MAX} bytes); not drawn"
        return Attention.model_validate_json(path.read_bytes()).model_dump(), None
    except FileNotFoundError:
        return None, None
    except OSError as err:
        return None, f"{path}: cannot be read ({err.strerror})"
    except ValidationError as err:
        return None, f"{path}: damaged, not drawn ({err.errors()[0]['msg']})"


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None  # (JSON has no NaN: a gap)


def _best_first(value: float | None) -> tuple[bool, float]:
    """A sort key: the least value first, a missing or not finite one last."""
    finite = None if value is None else _finite(value)
    return finite is None, finite or 0.0
