#!/usr/bin/env python3
"""The course notebook's "same model": `python -m tinygpt.train`, runnable as a script from this folder or from
the repository root, with the same flags, help and exit codes. Not a copy of the trainer: it puts the
repository on the import path and hands over to `tinygpt.train`.

    cd hpc_lab/04_tinygpt && python train_tinygpt.py --n-layer 6 --n-head 6 --n-embd 384 --block-size 256
    python hpc_lab/04_tinygpt/train_tinygpt.py --help                 # from the repository root

Paths (the run directory, runs/default unless --out-dir says otherwise; the data cache, ./data) are
relative to the folder it is run from, as for `python -m tinygpt.train`. On a cluster: train.sbatch, here.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tinygpt.train import cli  # noqa: E402 (importable from the line above)

if __name__ == "__main__":
    cli()
