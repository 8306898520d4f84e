"""`launch.py status SPEC`: one row per run, from Slurm and from the run directory.

State comes from sacct (accounting); when accounting is off or does not know the job, from squeue; when
Slurm knows nothing (a --local run, or a job long gone), from what the run directory says. The `from`
column says which. Progress (step, losses, tokens/s, ETA) always comes from the run's metrics.jsonl.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from . import manifest as manifest_mod
from . import slurm_cli

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
            "FINISHED", "PREEMPTED"}


@dataclass
class Row:
    index: int
    name: str
    job_id: str
    state: str
    source: str
    restarts: int | None
    step: int | None
    max_steps: int | None
    train_loss: float | None
    val_loss: float | None
    tokens_per_s: float | None
    eta_s: float | None
    run_dir: str


def read_progress(run_dir: Path) -> dict:
    """What metrics.jsonl says: last step, losses, speed, whether the run finished or was paused."""
    info: dict = {}
    path = run_dir / "metrics.jsonl"
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return info
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        event = rec.get("event")
        if event == "start":
            info["started"] = True
            info["restarts_seen"] = rec.get("restarts")
            info.pop("event", None)
        elif event:
            info["event"] = event
        if "lr" in rec:
            info.update(step=rec["step"], train_loss=rec["train_loss"], tokens_per_s=rec.get("tokens_per_s"),
                        elapsed_s=rec.get("elapsed_s"))
        if "val_loss" in rec:
            info["val_loss"] = rec["val_loss"]
            info["step"] = max(info.get("step", 0), rec["step"])
    return info


def state_from_run_dir(progress: dict) -> str:
    if progress.get("event") == "finished":
        return "FINISHED"
    if progress.get("event") in ("preempted", "paused"):
        return "STOPPED"
    if progress.get("started"):
        return "STARTED"
    return "NOT STARTED"


def collect(manifest_path: Path) -> list[Row]:
    manifest = manifest_mod.load(manifest_path)
    ids = manifest_mod.task_job_ids(manifest)
    wanted = sorted(set(ids.values()))
    slurm_states = {}
    if wanted:
        since = min((s["submitted_at"] for s in manifest["submissions"] if s.get("backend") != "local"),
                    default=None)
        accounted = slurm_cli.sacct_states(wanted, since) or {}
        missing = [j for j in wanted if j not in accounted]
        queued = slurm_cli.squeue_states(missing) if missing else {}
        slurm_states = {**(queued or {}), **accounted}
        restarts = slurm_cli.restart_counts([j for j in wanted if slurm_states.get(j) is None
                                             or slurm_states[j].restarts is None])
    else:
        restarts = {}
    rows = []
    for run in manifest["runs"]:
        run_dir = Path(run["out_dir"])
        progress = read_progress(run_dir)
        job_id = ids.get(run["index"], "")
        js = slurm_states.get(job_id)
        if js is not None:
            state, source = js.state, js.source
            restart_count = js.restarts if js.restarts is not None else restarts.get(job_id)
        else:
            state, source = state_from_run_dir(progress), "run dir"
            restart_count = restarts.get(job_id, progress.get("restarts_seen"))
        step, max_steps = progress.get("step"), run.get("max_steps")
        eta = None
        if step and max_steps and progress.get("elapsed_s") and state not in TERMINAL and step < max_steps:
            eta = progress["elapsed_s"] / step * (max_steps - step)
        rows.append(Row(run["index"], run["name"], job_id or "-", state, source, restart_count, step, max_steps,
                        progress.get("train_loss"), progress.get("val_loss"), progress.get("tokens_per_s"), eta,
                        str(run_dir)))
    return rows


def table(rows: list[Row], title: str):
    from rich.table import Table

    from tinygpt.progress import format_duration

    t = Table(title=title, title_justify="left")
    for col, justify in (("#", "right"), ("run", "left"), ("job", "left"), ("state", "left"), ("from", "left"),
                         ("restarts", "right"), ("step", "right"), ("train", "right"), ("val", "right"),
                         ("tok/s", "right"), ("ETA", "right")):
        t.add_column(col, justify=justify, no_wrap=col != "run", min_width=len(col))
    t.add_column("run dir", overflow="fold")
    colors = {"COMPLETED": "green", "FINISHED": "green", "RUNNING": "cyan", "PENDING": "yellow",
              "FAILED": "red", "CANCELLED": "magenta", "TIMEOUT": "red", "REQUEUED": "yellow"}
    for r in rows:
        state = r.state.split()[0] if r.state else "?"
        t.add_row(
            str(r.index), r.name, r.job_id, f"[{colors.get(state, 'white')}]{r.state}[/]", r.source,
            "-" if r.restarts is None else str(r.restarts),
            "-" if r.step is None else f"{r.step}/{r.max_steps}",
            "-" if r.train_loss is None else f"{r.train_loss:.4f}",
            "-" if r.val_loss is None else f"{r.val_loss:.4f}",
            "-" if r.tokens_per_s is None else f"{r.tokens_per_s:,.0f}",
            "-" if r.eta_s is None else format_duration(r.eta_s),
            r.run_dir,
        )
    return t


def show(manifest_path: Path, watch: bool = False, interval: float = 5.0, console=None) -> list[Row]:
    from rich.console import Console

    console = console or Console()
    title = f"sweep {manifest_mod.load(manifest_path)['name']}  ({manifest_path})"
    rows = collect(manifest_path)
    if not watch:
        console.print(table(rows, title))
        return rows
    from rich.live import Live

    with Live(table(rows, title), console=console, refresh_per_second=1) as live:
        while not all(r.state.split()[0] in TERMINAL for r in rows):
            time.sleep(interval)
            rows = collect(manifest_path)
            live.update(table(rows, title))
    return rows
