"""The launcher's one exception type: every user mistake becomes a LaunchError, printed without a traceback."""

from __future__ import annotations

from tinygpt.base.errors import ProblemsError


class LaunchError(ProblemsError):
    """One or more problems; `problems` holds one message each, naming the field and the fix."""

    exit_status = 1
