"""`launch.py status SPEC`: the sweep's table, one row per run (read/run_states.py says what each run is doing), fitted
to the terminal, with the chain's steps above it and the failures' last error lines and an Optuna search's
trials under it. The `from` column says where a run's state came from: sacct, squeue or its run directory.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from tinygpt.launch import manifest as manifest_mod
from tinygpt.launch.console import next_command, stop_if_interrupted
from tinygpt.launch.read.run_states import SUMMARY_ABOVE, Row, Rows, collect

if TYPE_CHECKING:
    from tinygpt.launch.manifest import Manifest

# Columns, and the order in which a narrow terminal hides them (first: the first to go). "#", "run", "state",
# "step" and "val" always stay.
COLUMNS = (("#", "right"), ("run", "left"), ("job", "left"), ("state", "left"), ("from", "left"),
           ("restarts", "right"), ("round", "right"), ("step", "right"), ("train", "right"), ("val", "right"),
           ("tok/s", "right"), ("ETA", "right"), ("before", "left"), ("run dir", "left"))
HIDE_ORDER = ("run dir", "before", "from", "restarts", "tok/s", "train", "job", "ETA")
RUN_NAME_MIN = 24  # a run name narrower than this is never wrapped


def cells(r: Row) -> dict[str, str]:
    from tinygpt.training.progress import format_duration

    return {
        "#": str(r.index), "run": r.name, "job": r.job_id, "state": r.state,
        "from": r.source, "restarts": "-" if r.restarts is None else str(r.restarts),
        "round": "-" if r.round is None else str(r.round),
        "step": "-" if r.step is None else str(r.step) if r.max_steps is None else f"{r.step}/{r.max_steps}",
        "train": "-" if r.train_loss is None else f"{r.train_loss:.4f}",
        "val": "-" if r.val_loss is None else f"{r.val_loss:.4f}",
        "tok/s": "-" if r.tokens_per_s is None else f"{r.tokens_per_s:,.0f}",
        "ETA": f"starts {r.starts}" if r.starts else "-" if r.eta_s is None else format_duration(r.eta_s),
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
    hidden += () if any(r.round for r in rows) else ("round",)  # (no retry policy)
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
    hidden_here = tuple(col for col in hidden if (col != "before" or any(r.history for r in rows))
                        and (col != "round" or any(r.round for r in rows)))
    if not hidden_here:
        return t
    hidden = hidden_here
    note = f"hidden to fit {width} columns: {', '.join(hidden)} (a wider terminal, or COLUMNS=200, shows them)"
    parents = {str(Path(r.run_dir).parent) for r in rows}
    if "run dir" in hidden and len(parents) == 1 and all(Path(r.run_dir).name == r.name for r in rows):
        note += f"\nrun dirs: {parents.pop()}/<run>"
    return Group(t, Text(note, style="dim"))


LIVE = ("RUNNING", "COMPLETING", "REQUEUED", "SUSPENDED", "STARTED")  # (STARTED: a run directory's word)


def view(rows: list[Row], title: str, width: int, every_row: bool = False):
    """The sweep's table; above SUMMARY_ABOVE runs (unless `every_row`), how many runs are in each state, and the
    table of the failed and live ones only."""
    if every_row or len(rows) <= SUMMARY_ABOVE:
        return fitted(rows, title, width)
    from rich.console import Group
    from rich.text import Text

    counts = Counter(r.state.name for r in rows)
    by_state = ", ".join(f"{count:,} {state}" for state, count in counts.most_common())
    listed = [r for r in rows if r.state.failed or r.state.name in LIVE]
    parts = [Text(f"{title}\n{len(rows):,} runs: {by_state}")]
    if listed:
        parts.append(fitted(listed, f"the {len(listed):,} failed or running", width))
    parts.append(Text("(--all shows every run)", style="dim"))
    return Group(*parts)


def show(manifest: Manifest, watch: bool = False, interval: float = 5.0, console=None,
         every_row: bool = False) -> list[Row]:
    if console is None:
        from tinygpt.launch.console import console as output_console

        console = output_console()
    title = f"sweep {manifest.name}  ({manifest.path})"
    rows = collect(manifest)
    from tinygpt.launch.heal import decide, waves
    from tinygpt.launch.read.run_states import chain_steps

    chain = chain_steps(manifest)
    for line in [chain] * bool(chain) + decide.status_lines(manifest, rows)[0] + waves.status_lines(manifest, rows):
        console.print(line, soft_wrap=True, markup=False)
    if not watch:
        console.print(view(rows, title, console.width, every_row))
        _print_notes(manifest, rows, console)
        return rows
    from rich.live import Live

    with Live(view(rows, title, console.width, every_row), console=console, refresh_per_second=1) as live:
        while not all(r.state.ended for r in rows):
            stop_if_interrupted()
            time.sleep(interval)
            manifest = manifest_mod.load(manifest.path)  # (a resubmission may have added jobs meanwhile)
            rows = collect(manifest)
            live.update(view(rows, title, console.width, every_row))
    _print_notes(manifest, rows, console)
    return rows


def _print_notes(manifest: Manifest, rows: Rows, console) -> None:
    """Under the table: what it cannot say by itself."""
    _print_unheard(rows, console)
    if manifest.command is not None and manifest.search is None and all(r.step is None for r in rows):
        console.print("note: no run of this program has reported a step (in a metrics.jsonl of its run directory, "
                      "or in its log through command.progress): the states "
                      f"are Slurm's alone (`{next_command('logs')} SPEC RUN` shows what a run printed)", soft_wrap=True,
                      markup=False)
    _print_failures(manifest, rows, console)
    _print_trials(manifest, console)


def _print_unheard(rows: Rows, console) -> None:
    """Under the table: which of Slurm's daemons did not answer, so that its states are read as what the others
    and the run directories knew."""
    from rich.markup import escape

    for words in rows.unheard:
        console.print(f"[yellow]note:[/] {escape(words)}; the states above are what the rest of Slurm and the run "
                      f"directories say; ask again in a minute", soft_wrap=True)


def _print_trials(manifest: Manifest, console) -> None:
    """The trials of an Optuna search, under the table of its workers."""
    if not manifest.search:
        return
    from tinygpt.launch.read import study

    rows = study.trials(manifest)
    console.print(study.trials_table(rows, f"trials of the Optuna study ({manifest.search.journal})")
                  if rows else "no trial yet")


def _print_failures(manifest: Manifest, rows: list[Row], console) -> None:
    """Under the table: the last error line of each run whose job failed, from its log."""
    from rich.markup import escape

    from tinygpt.launch.read import log_files

    failed = [r for r in rows if r.state.failed]
    if not failed:
        return
    console.print(f"[red]failed[/] (`{next_command('logs')} SPEC RUN` shows the whole log; "
                  f"`{next_command('resubmit')} SPEC` runs them again):")
    for r in failed:
        line = log_files.last_error(manifest, r.index) or "(no log)"
        console.print(f"  {escape(r.name)} ({r.job_id} {r.state.name}): {escape(line)}", soft_wrap=True)


def show_efficiency(manifest: Manifest) -> None:
    """`launch.py status SPEC --efficiency`: the table on the terminal (every column when piped)."""
    from rich.table import Table

    from tinygpt.launch.console import console
    from tinygpt.launch.read.efficiency import columns_of, table_rows

    rows = table_rows(manifest)
    if not rows:
        print(f"no job of sweep {manifest.name} went to Slurm: nothing to account for")
        return
    t = Table(title=f"sweep {manifest.name}: use of the allocation (sacct; the latest job of each run)",
              title_justify="left")
    columns = columns_of(rows)
    for col in columns:
        t.add_column(col, justify="left" if col in ("run", "job", "state", "flag") else "right",
                     no_wrap=col not in ("run", "flag"))
    for row in rows:
        t.add_row(*(f"[red]{row[c]}[/]" if c == "flag" else row[c] for c in columns))
    console().print(t)
