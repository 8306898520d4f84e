"""`python -m tinygpt.launch ...` (and the `tinygpt-launch` command): what `python launch.py ...` does, from any
folder."""

import sys

from tinygpt.launch.commands.cli import main

if __name__ == "__main__":  # (not when a test imports every module)
    sys.exit(main())
