"""The console the launcher's commands print to: a terminal's width and colours, or, when piped into a file,
grep or a pager, plain lines at full width that never wrap (there is no screen to fit); the spec as its user
names it, in what a command tells them to run next; and the user's Ctrl-C at it."""

from __future__ import annotations

import os
import shlex


def console():
    from rich.console import Console

    out = Console()
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out = Console(width=1_000)
    return out


INTERRUPTS: list[int] = []  # the Ctrl-Cs this command got


def interrupted(signum: int, _frame) -> None:
    """Python's own answer to a Ctrl-C (KeyboardInterrupt), remembered: a command ends 130 on Ctrl-C wherever it
    lands, also in a library that catches it and raises its own error instead (pydantic, building a validator), and
    where Python only prints it ("Exception ignored": one raised while importlib runs a callback of its own), which
    a command that waits hears at its next `stop_if_interrupted`. (commands/cli.py installs it.)"""
    INTERRUPTS.append(signum)
    raise KeyboardInterrupt


def stop_if_interrupted() -> None:
    """A Ctrl-C that was heard but swallowed on its way ends the command now."""
    if INTERRUPTS:
        raise KeyboardInterrupt


SPEC_AS = "TINYGPT_SPEC_AS"  # how the user named the spec on the laptop that sent this command (remote/laptop.py)
# How the user runs the launcher, with the --workdir they gave: on a login node running a laptop's command, the
# laptop's words (remote/laptop.py sends them); else this process's own (commands/cli.py says them once).
INVOKED_AS = "TINYGPT_INVOKED_AS"
_invoked = {"program": "python launch.py", "workdir": ""}


def shown(spec: str) -> str:
    """The spec as its user names it: on a login node running a laptop's command, the laptop's name for it."""
    return os.environ.get(SPEC_AS) or spec


def invoked(argv0: str, workdir: str | None) -> None:
    """Remember how this process was run (`tinygpt-launch`, `python -m tinygpt.launch`, `python launch.py`) and the
    --workdir the user gave, for every hint it prints."""
    name = os.path.basename(argv0)
    program = ("python launch.py" if name == "launch.py" else "python -m tinygpt.launch"
               if name in ("__main__.py", "-m") else name or "tinygpt-launch")
    _invoked.update(program=program, workdir="" if workdir in (None, ".") else f" --workdir {shlex.quote(workdir)}")


def said_as() -> str:
    """How the user runs the launcher, with their --workdir: what a laptop sends the login node as INVOKED_AS."""
    return os.environ.get(INVOKED_AS) or _invoked["program"] + _invoked["workdir"]


def next_command(words: str, spec: str | None = None) -> str:
    """A command the user may run next, as they run the launcher: `tinygpt-launch status s.yaml --workdir w`
    (the --workdir only with a spec: a command of a sweep)."""
    said = said_as()
    program, _, workdir = said.partition(" --workdir ")
    if spec is None:
        return f"{program} {words}"
    return f"{program} {words} {shlex.quote(shown(spec))}" + (f" --workdir {workdir}" if workdir else "")
