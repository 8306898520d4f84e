"""How fast this CPU multiplies bf16 matrices, against fp32: measured, because flags do not tell.

A CPU with AVX512-BF16 or AMX multiplies bf16 natively, faster than fp32. One with AVX-512 but no bf16
instructions, or AVX2 only, may go through oneDNN's conversions (about as fast as fp32) or through PyTorch's
serial fallback (tens of times slower: 512x512 in ~210 ms against 2.4 ms on a Zen 2 EPYC), and which one a given
CPU, torch build and setting takes is not written in /proc/cpuinfo. So the policy times one product in each
dtype. The answer is kept per CPU model, torch version, thread count and oneDNN setting in
`$XDG_CACHE_HOME/tinygpt/bf16-matmul.json` (default `~/.cache/...`): a start pays for it once. A damaged or
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

SIZE = 192  # a matrix side in the range of Muon's Gram products for this project's models (96 to 384 wide)
REPEATS = 3


def cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tinygpt" / "bf16-matmul.json"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            return next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "")
    except OSError:
        return platform.processor() or platform.machine()


def key() -> str:
    return (f"{cpu_model()} | torch {torch.__version__} | {torch.get_num_threads()} thread(s) | "
            f"oneDNN {'on' if torch.backends.mkldnn.enabled else 'off'}")


def ratio() -> float:
    """The time of a bf16 matmul over that of the same fp32 one on this CPU (below 1: bf16 is faster)."""
    path, here = cache_file(), key()
    known = _read(path)
    if isinstance(known.get(here), float) and known[here] > 0:
        return known[here]
    measured = measure()
    try:
        durable.write(path, json.dumps({**known, here: measured}, indent=1, sort_keys=True) + "\n")
    except OSError:
        pass  # (a read-only home: measured again next time)
    return measured


def measure(size: int = SIZE) -> float:
    a = torch.randn(size, size)
    return _best(a.bfloat16()) / _best(a)


def _best(x: torch.Tensor) -> float:
    x @ x  # (warm-up: the first product of a dtype may load or pick its kernel)
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        x @ x
        times.append(time.perf_counter() - start)
    return max(min(times), 1e-9)


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
