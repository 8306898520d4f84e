#!/usr/bin/env python3
"""Turn a YAML job or sweep into Slurm jobs (sbatch job arrays or submitit), or run it locally on CPU.

A thin entry point: parsing and everything else live in `tinygpt.launch`, which never imports torch.
"""

import sys

from tinygpt.launch.commands.cli import main

if __name__ == "__main__":
    sys.exit(main())
