"""`python launch.py`: the launcher's command line (being built; see the launcher issue)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("launch.py: the launcher is not built yet; train directly with `python -m tinygpt.train --help`",
          file=sys.stderr)
    return 1
