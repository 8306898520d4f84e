"""The launcher's one exception type: every user mistake becomes a LaunchError, printed without a traceback."""

from __future__ import annotations


class LaunchError(Exception):
    """One or more problems; `problems` holds one message each, naming the field and the fix."""

    def __init__(self, problems: list[str] | str, source: str | None = None):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        head = f"{source}: " if source else ""
        if len(self.problems) == 1:
            text = head + self.problems[0]
        else:
            text = head + f"{len(self.problems)} problems:\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(text)
