"""Whether this CPU orthogonalises Muon's updates faster in bf16 or in fp32: measured, because flags do not tell.

A CPU with AVX512-BF16 or AMX multiplies bf16 natively; one without may take oneDNN's conversions or PyTorch's
serial fallback (a Zen 2 EPYC: a 512x512 bf16 matmul in ~210 ms against 2.4 ms in fp32), and which one a given
CPU, torch build and setting takes is not written in /proc/cpuinfo. Nor is a fast bf16 matmul enough: at the
small shapes of this project's models, conversions and kernel choice can make bf16 the slower. So the policy times
the very work, Muon's orthogonalisation of one step's matrices of the model (optimizers.orthogonalise), in each
dtype. The answer is kept per CPU model, torch version, thread count, oneDNN setting and shapes in
`$XDG_CACHE_HOME/tinygpt/muon-bf16.json` (default `~/.cache/...`): a start pays for it once. A damaged or
unwritable cache is measured around, never trusted.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

from tinygpt.base import durable

REPEATS = 3


def cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tinygpt" / "muon-bf16.json"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            return next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "")
    except OSError:
        return platform.processor() or platform.machine()


def key(shapes: list[tuple[int, int]]) -> str:
    return (f"{cpu_model()} | torch {torch.__version__} | {torch.get_num_threads()} thread(s) | "
            f"oneDNN {'on' if torch.backends.mkldnn.enabled else 'off'} | {describe(shapes)}")


def describe(shapes: list[tuple[int, int]]) -> str:
    """`8 matrices of 128x384 to 512x128`: the work a figure is of."""
    areas = sorted(set(shapes), key=lambda s: (s[0] * s[1], s))
    return f"{len(shapes)} matrices of {areas[0][0]}x{areas[0][1]} to {areas[-1][0]}x{areas[-1][1]}"


def ratio(shapes: list[tuple[int, int]]) -> float:
    """The time of orthogonalising matrices of these shapes in bf16 over that in fp32 (below 1: bf16 is faster)."""
    path, here = cache_file(), key(shapes)
    known = _read(path)
    if isinstance(known.get(here), float) and known[here] > 0:
        return known[here]
    measured = measure(shapes)
    try:
        durable.write(path, json.dumps({**known, here: measured}, indent=1, sort_keys=True) + "\n")
    except OSError:
        pass  # (a read-only home: measured again next time)
    return measured


def measure(shapes: list[tuple[int, int]]) -> float:
    from tinygpt.training.optimizers import orthogonalise, torchs_iteration

    generator = torch.Generator().manual_seed(0)
    updates = [torch.randn(shape, generator=generator) for shape in shapes]
    seconds = {dtype: best_seconds(lambda dtype=dtype: orthogonalise(updates, *torchs_iteration(), dtype))
               for dtype in (torch.bfloat16, torch.float32)}
    return seconds[torch.bfloat16] / seconds[torch.float32]


def best_seconds(work) -> float:
    """The fastest of a few timed calls of `work`, after one untimed."""
    work()  # (warm-up: the first product of a dtype may load or pick its kernel)
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return max(min(times), 1e-9)


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
