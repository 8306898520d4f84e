"""The console the launcher's commands print to: a terminal's width and colours, or, when piped into a file,
grep or a pager, plain lines at full width that never wrap (there is no screen to fit)."""

from __future__ import annotations

import os


def console():
    from rich.console import Console

    out = Console()
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out = Console(width=1_000)
    return out
