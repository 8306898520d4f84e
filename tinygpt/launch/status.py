"""`launch.py status SPEC`: one row per run, from Slurm and from the run directory.

State comes from sacct (accounting); when accounting is off or does not know the job, from squeue; when
Slurm knows nothing (a --local run, or a job long gone), from what the run directory says. The `from`
column says which. A run whose job ended after the watchdog's `hung` record (tinygpt/watchdog.py) is HUNG,
at its step, on the nodes of the ranks that stopped answering. Progress (step, losses, tokens/s, ETA) always
comes from the run's metrics.jsonl.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from tinygpt import metrics

from . import manifest as manifest_mod
from . import slurm_cli

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
            "HUNG", "FINISHED", "PREEMPTED", "PRUNED"}
FAILED = ("FAILED", "OUT_OF_MEMORY", "NODE_FAIL", "TIMEOUT", "BOOT_FAIL", "DEADLINE", "HUNG")


class RunState(str):
    """A run's state as shown: Slurm's word (`COMPLETED`, `CANCELLED by 1000`) or ours (`FINISHED`, `HUNG at step
    120`, from the run directory). The text compares as it reads; `name` is the word alone."""

    @property
    def name(self) -> str:
        return self.split(" ", 1)[0] if self.strip() else "?"

    @property
    def ended(self) -> bool:
        return self.name in TERMINAL

    @property
    def failed(self) -> bool:
        return self.name in FAILED


@dataclass
class Row:
    index: int
    name: str
    job_id: str
    state: RunState
    source: str
    restarts: int | None
    step: int | None
    max_steps: int | None
    train_loss: float | None
    val_loss: float | None
    tokens_per_s: float | None
    eta_s: float | None
    run_dir: str
    nodes: str = ""  # where its latest life ran
    history: tuple[str, ...] = ()  # its earlier submissions: "JOB STATE on NODES", oldest first

    def __post_init__(self) -> None:
        self.state = RunState(self.state)


def read_progress(run_dir: Path) -> dict:
    """What metrics.jsonl says: last step, losses, speed, whether the run finished or was paused."""
    info: dict = {}
    for rec in metrics.read(run_dir / "metrics.jsonl"):
        event = rec.get("event")
        if event == "start":
            info["started"] = True
            info["restarts_seen"] = rec.get("restarts")
            info.pop("event", None)
        elif event:
            info["event"] = event
            if event == "hung":  # (the watchdog's record: tinygpt/watchdog.py)
                info["hung"] = rec
        if "lr" in rec:
            info.update(step=rec["step"], train_loss=rec.get("train_loss"), tokens_per_s=rec.get("tokens_per_s"),
                        elapsed_s=rec.get("elapsed_s"))
        if rec.get("val_loss") is not None:
            info["val_loss"] = rec["val_loss"]
            info["step"] = max(info.get("step", 0), rec["step"])
    return info


def state_from_run_dir(progress: dict) -> RunState:
    if progress.get("event") == "finished":
        return RunState("FINISHED")
    if progress.get("event") == "pruned":
        return RunState("PRUNED")
    if progress.get("event") in ("preempted", "paused"):
        return RunState("STOPPED")
    if progress.get("started"):
        return RunState("STARTED")
    return RunState("NOT STARTED")


def collect(manifest: dict) -> list[Row]:
    """A row per run of the sweep whose (loaded) manifest this is."""
    ids = manifest_mod.task_job_ids(manifest)
    wanted = sorted(set(ids.values()))
    slurm_states = {}
    if wanted:
        since = manifest_mod.first_submitted(manifest)
        # Asked by job (an array's id stands for all its tasks): one call per command, however many tasks.
        accounted = slurm_cli.sacct_states(jobs_of(wanted), since) or {}
        missing = [j for j in wanted if j not in accounted]
        queued = slurm_cli.squeue_states(jobs_of(missing)) if missing else {}
        slurm_states = {**(queued or {}), **accounted}
        restarts = slurm_cli.restart_counts(jobs_of([j for j in wanted if slurm_states.get(j) is None
                                                     or slurm_states[j].restarts is None]))
    else:
        restarts = {}
    history = submission_history(manifest)
    rows = []
    for run in manifest["runs"]:
        run_dir = Path(run["out_dir"])
        progress = read_progress(run_dir)
        job_id = ids.get(run["index"], "")
        js = slurm_states.get(job_id)
        if js is not None:
            state, source = RunState(js.state), js.source
            restart_count = js.restarts if js.restarts is not None else restarts.get(job_id)
        else:
            state, source = state_from_run_dir(progress), "run dir"
            restart_count = restarts.get(job_id, progress.get("restarts_seen"))
        nodes = js.nodes if js else ""
        if progress.get("event") == "hung" and state.name not in ("RUNNING", "PENDING", "COMPLETING", "REQUEUED"):
            hung = progress["hung"]  # the ranks that stopped answering, where known, else the one that said so
            listed = hung.get("silent_nodes") if isinstance(hung.get("silent_nodes"), list) else []
            silent = [n for n in listed if isinstance(n, str) and n and " " not in n]
            state, nodes = RunState(f"HUNG at step {hung['step']}"), ",".join(silent)
        step, max_steps = progress.get("step"), run.get("max_steps")
        eta = None
        if step and max_steps and progress.get("elapsed_s") and not state.ended and step < max_steps:
            eta = progress["elapsed_s"] / step * (max_steps - step)
        rows.append(Row(run["index"], run["name"], job_id or "-", state, source, restart_count, step, max_steps,
                        progress.get("train_loss"), progress.get("val_loss"), progress.get("tokens_per_s"), eta,
                        str(run_dir), nodes, history.get(run["index"], ())))
    return rows


def jobs_of(task_ids: list[str]) -> list[str]:
    """The distinct jobs of some array tasks (`123_4` -> `123`) and plain jobs."""
    return sorted({task_id.split("_")[0] for task_id in task_ids})


def submission_history(manifest: dict) -> dict[int, tuple[str, ...]]:
    """Run index -> its earlier lives as recorded by `launch.py resubmit` ("JOB STATE on NODES")."""
    history: dict[int, tuple[str, ...]] = {}
    for sub in manifest.get("submissions", []):
        for index, before in sorted((sub.get("previous") or {}).items(), key=lambda kv: int(kv[0])):
            where = f" on {before['nodes']}" if before.get("nodes") else ""
            history[int(index)] = history.get(int(index), ()) + (f"{before['job_id']} {before['state']}{where}",)
    return history


# Columns, and the order in which a narrow terminal hides them (first: the first to go). "#", "run", "state",
# "step" and "val" always stay.
COLUMNS = (("#", "right"), ("run", "left"), ("job", "left"), ("state", "left"), ("from", "left"),
           ("restarts", "right"), ("step", "right"), ("train", "right"), ("val", "right"), ("tok/s", "right"),
           ("ETA", "right"), ("before", "left"), ("run dir", "left"))
HIDE_ORDER = ("run dir", "before", "from", "restarts", "tok/s", "train", "job", "ETA")
RUN_NAME_MIN = 24  # a run name narrower than this is never wrapped


def cells(r: Row) -> dict[str, str]:
    from tinygpt.progress import format_duration

    return {
        "#": str(r.index), "run": r.name, "job": r.job_id, "state": r.state,
        "from": r.source, "restarts": "-" if r.restarts is None else str(r.restarts),
        "step": "-" if r.step is None else f"{r.step}/{r.max_steps}",
        "train": "-" if r.train_loss is None else f"{r.train_loss:.4f}",
        "val": "-" if r.val_loss is None else f"{r.val_loss:.4f}",
        "tok/s": "-" if r.tokens_per_s is None else f"{r.tokens_per_s:,.0f}",
        "ETA": "-" if r.eta_s is None else format_duration(r.eta_s),
        "before": " > ".join(r.history) or "-",
        "run dir": r.run_dir,
    }


def table(rows: list[Row], title: str, hidden: tuple[str, ...] = ()):
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    name_width = min(RUN_NAME_MIN, max([len(r.name) for r in rows] + [3]))
    for col, justify in COLUMNS:
        if col in hidden:
            continue
        if col == "run":
            t.add_column(col, justify=justify, min_width=name_width, overflow="fold")
        elif col == "before":
            t.add_column(col, overflow="fold", min_width=12)
        elif col == "run dir":
            t.add_column(col, overflow="fold", min_width=min(30, max([len(r.run_dir) for r in rows] + [7])))
        else:
            t.add_column(col, justify=justify, no_wrap=True, min_width=len(col))
    for r in rows:
        row = cells(r)
        color = STATE_COLORS.get(r.state.name, "white")
        row["state"] = f"[{color}]{escape(row['state'])}[/]"
        t.add_row(*(row[col] for col, _ in COLUMNS if col not in hidden))
    return t


STATE_COLORS = {"COMPLETED": "green", "FINISHED": "green", "RUNNING": "cyan", "PENDING": "yellow", "FAILED": "red",
                "HUNG": "red", "CANCELLED": "magenta", "TIMEOUT": "red", "REQUEUED": "yellow"}
PLAIN_ABOVE = 200  # rows; rich's layout time grows with the rows, so larger sweeps get a plain aligned table


def plain_table(rows: list[Row], title: str, hidden: tuple[str, ...]):
    """The same columns as `table`, aligned by hand: a 1,000-run sweep's table in a tenth of a second."""
    from rich.text import Text

    shown = [(col, justify) for col, justify in COLUMNS if col not in hidden]
    texts = [cells(r) for r in rows]
    widths = {col: max([len(col)] + [len(t[col]) for t in texts]) for col, _ in shown}

    def line(values: dict[str, str]) -> str:
        return "  ".join(values[col].rjust(widths[col]) if justify == "right" else values[col].ljust(widths[col])
                         for col, justify in shown).rstrip()

    header = line({col: col for col, _ in shown})
    return Text("\n".join([title, header, "-" * len(header), *(line(t) for t in texts)]))


def fitted(rows: list[Row], title: str, width: int):
    """The table with as few columns hidden as `width` needs, and a line saying what was hidden."""
    from rich.console import Console, Group
    from rich.measure import Measurement
    from rich.text import Text

    measure_console = Console(width=10_000)
    hidden: tuple[str, ...] = () if any(r.history for r in rows) else ("before",)  # (nothing was resubmitted)
    # Measured on the rows that hold the longest text of some column: the same widths as all the rows give,
    # at the cost of a dozen rows instead of all of them.
    texts = [cells(r) for r in rows]
    widest = {max(range(len(rows)), key=lambda i: len(texts[i][col])) for col, _ in COLUMNS} if rows else set()
    sample = [rows[i] for i in sorted(widest)]
    for col in HIDE_ORDER:
        if col in hidden:
            continue
        # The narrowest the table can be without squeezing a column below its min_width: folding the run
        # dir is fine, squeezing "state" or "step" into two lines is not.
        if Measurement.get(measure_console, measure_console.options, table(sample, title, hidden)).minimum <= width:
            break
        hidden += (col,)
    t = table(rows, title, hidden) if len(rows) <= PLAIN_ABOVE else plain_table(rows, title, hidden)
    hidden_here = tuple(col for col in hidden if col != "before" or any(r.history for r in rows))
    if not hidden_here:
        return t
    hidden = hidden_here
    note = f"hidden to fit {width} columns: {', '.join(hidden)} (a wider terminal, or COLUMNS=200, shows them)"
    parents = {str(Path(r.run_dir).parent) for r in rows}
    if "run dir" in hidden and len(parents) == 1 and all(Path(r.run_dir).name == r.name for r in rows):
        note += f"\nrun dirs: {parents.pop()}/<run>"
    return Group(t, Text(note, style="dim"))


def show(manifest_path: Path, watch: bool = False, interval: float = 5.0, console=None) -> list[Row]:
    if console is None:
        from .console import console as output_console

        console = output_console()
    manifest = manifest_mod.load(manifest_path)  # (once: the jobs never change it, only launch.py does)
    title = f"sweep {manifest['name']}  ({manifest_path})"
    rows = collect(manifest)
    from .chain import describe

    chain = describe(manifest)
    if chain:
        console.print(chain, soft_wrap=True, markup=False)
    if not watch:
        console.print(fitted(rows, title, console.width))
        _print_failures(manifest, rows, console)
        _print_trials(manifest, console)
        return rows
    from rich.live import Live

    with Live(fitted(rows, title, console.width), console=console, refresh_per_second=1) as live:
        while not all(r.state.ended for r in rows):
            time.sleep(interval)
            manifest = manifest_mod.load(manifest_path)  # (a resubmission may have added jobs meanwhile)
            rows = collect(manifest)
            live.update(fitted(rows, title, console.width))
    _print_failures(manifest, rows, console)
    _print_trials(manifest, console)
    return rows


def _print_trials(manifest: dict, console) -> None:
    """The trials of an Optuna search, under the table of its workers."""
    if not manifest.get("search"):
        return
    from . import search

    rows = search.trials(manifest)
    console.print(search.trials_table(rows, f"trials of the Optuna study ({manifest['search']['journal']})")
                  if rows else "no trial yet")


def _print_failures(manifest: dict, rows: list[Row], console) -> None:
    """Under the table: the last error line of each run whose job failed, from its log."""
    from rich.markup import escape

    from . import logs

    failed = [r for r in rows if r.state.failed]
    if not failed:
        return
    console.print("[red]failed[/] (`launch.py logs SPEC RUN` shows the whole log; `launch.py resubmit SPEC` runs "
                  "them again):")
    for r in failed:
        line = logs.last_error(manifest, r.index) or "(no log)"
        console.print(f"  {escape(r.name)} ({r.job_id} {r.state.name}): {escape(line)}", soft_wrap=True)
