"""A packed run's share of its array task's GPUs. Packing puts several runs in one array task (`pack:` in a spec,
tinygpt/launch/submit/sbatch.py), each an `srun --overlap` step that Slurm hands all of the task's GPUs; each run
narrows CUDA_VISIBLE_DEVICES to its own share before CUDA starts.
"""

from __future__ import annotations

import os

# "J/P": this process is run J (from 0) of the P runs packed into one array task.
PACK_SLOT_ENV = "TINYGPT_PACK_SLOT"


def gpu_share(visible: list[str], slot: int, of: int) -> list[str]:
    """Run `slot`'s share of a task's GPUs when `of` runs are packed into it: an equal, contiguous slice each
    when there are at least as many GPUs as runs (8 GPUs, 4 runs: 2 each), else runs side by side on one GPU
    (2 GPUs, 4 runs: runs 0 and 1 on the first, 2 and 3 on the second)."""
    if not visible:
        return []
    lo = slot * len(visible) // of
    return visible[lo:max(lo + 1, (slot + 1) * len(visible) // of)]


def take_pack_share(environ: dict[str, str] = os.environ) -> None:
    """Narrow CUDA_VISIBLE_DEVICES to this packed run's share, before CUDA starts. Slurm hands every packed
    run (an `srun --overlap` step) all of the task's GPUs: asked for a count each, overlapping steps would all
    be given the same first ones."""
    slot = environ.get(PACK_SLOT_ENV, "")
    visible = [d for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    j, _, p = slot.partition("/")
    if visible and j.isdigit() and p.isdigit() and int(j) < int(p):
        environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_share(visible, int(j), int(p)))
