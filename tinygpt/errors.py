"""The base of the user-facing error types: one or more problems, each naming the field and the fix."""

from __future__ import annotations


class ProblemsError(Exception):
    """One or more problems; `problems` holds one message each. Printed without a traceback."""

    def __init__(self, problems: list[str] | str, source: str | None = None):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        head = f"{source}: " if source else ""
        if len(self.problems) == 1:
            text = head + self.problems[0]
        else:
            text = head + f"{len(self.problems)} problems:\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(text)
