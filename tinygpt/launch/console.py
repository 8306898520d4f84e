"""The console the launcher's commands print to: a terminal's width and colours, or, when piped into a file,
grep or a pager, plain lines at full width that never wrap (there is no screen to fit); and the spec as its
user names it, in what a command tells them to run next."""

from __future__ import annotations

import os


def console():
    from rich.console import Console

    out = Console()
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out = Console(width=1_000)
    return out


SPEC_AS = "TINYGPT_SPEC_AS"  # how the user named the spec on the laptop that sent this command (remote/laptop.py)


def shown(spec: str) -> str:
    """The spec as its user names it: on a login node running a laptop's command, the laptop's name for it."""
    return os.environ.get(SPEC_AS) or spec
