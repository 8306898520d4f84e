"""What the trainer prints on rank 0: a rich progress bar on a terminal, greppable lines in a Slurm log.

Plain lines look like

    step   250/2000 | loss 2.0412 | lr 9.70e-04 | 48,113 tok/s | mfu 31.2% | eta 1m12s

so `grep '^step' logs/...out` gives a loss curve, and `val` lines the evaluations.
"""

from __future__ import annotations

import sys
import time


def format_duration(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


def step_line(step: int, max_steps: int, metrics: dict) -> str:
    parts = [f"step {step:>{len(str(max_steps))}}/{max_steps}", f"loss {metrics['train_loss']:.4f}",
             f"lr {metrics['lr']:.2e}", f"{metrics['tokens_per_s']:,.0f} tok/s"]
    if metrics.get("mfu") is not None:
        parts.append(f"mfu {100 * metrics['mfu']:.1f}%")
    parts.append(f"eta {format_duration(metrics.get('eta_s'))}")
    return " | ".join(parts)


class Progress:
    """Base: prints messages from the start; subclasses show steps once training starts."""

    def __init__(self, max_steps: int):
        self.max_steps = max_steps

    def start(self, step: int) -> Progress:
        """Training begins (or resumes) at `step`; use as `with progress.start(step):`."""
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def message(self, text: str) -> None:
        print(text, flush=True)

    def step(self, step: int, metrics: dict) -> None:
        pass

    def close(self) -> None:
        pass


class Silent(Progress):
    def message(self, text: str) -> None:
        pass


class PlainLines(Progress):
    """One line per logged step, at most every `min_interval_s` seconds (and always the last)."""

    def __init__(self, max_steps: int, min_interval_s: float = 2.0):
        super().__init__(max_steps)
        self.min_interval_s = min_interval_s
        self._last = -1e9

    def step(self, step: int, metrics: dict) -> None:
        now = time.monotonic()
        if now - self._last >= self.min_interval_s or step == self.max_steps:
            self._last = now
            print(step_line(step, self.max_steps, metrics), flush=True)


class RichBar(Progress):
    def __init__(self, max_steps: int, console=None):
        super().__init__(max_steps)
        from rich.console import Console

        self.console = console or Console(stderr=False)
        self.bar = None

    def start(self, step: int) -> Progress:
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
        from rich.progress import Progress as RP

        self.bar = RP(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                      TimeRemainingColumn(), console=self.console, transient=False)
        self.task = self.bar.add_task("train", total=self.max_steps, completed=step, info="")
        self.bar.start()
        return self

    def message(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False)

    def step(self, step: int, metrics: dict) -> None:
        info = f"loss {metrics['train_loss']:.4f}  {metrics['tokens_per_s']:,.0f} tok/s"
        if metrics.get("mfu") is not None:
            info += f"  mfu {100 * metrics['mfu']:.1f}%"
        self.bar.update(self.task, completed=step, info=info)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def make(mode: str, is_main: bool, max_steps: int) -> Progress:
    if not is_main or mode == "off":
        return Silent(max_steps)
    if mode == "bar" or (mode == "auto" and sys.stdout.isatty()):
        return RichBar(max_steps)
    return PlainLines(max_steps)
