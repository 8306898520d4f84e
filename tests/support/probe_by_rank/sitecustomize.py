"""Test-only: with this folder on PYTHONPATH, the trainer's bf16 probe answers by rank, rank 0 that bf16 is the
faster and every other rank that it is the slower, as ranks that time it side by side on a busy machine may."""

import os

from tinygpt.training import bf16_probe

bf16_probe.ratio = lambda shapes: 0.5 if os.environ.get("RANK", "0") == "0" else 2.0
