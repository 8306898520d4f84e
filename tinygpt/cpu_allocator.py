"""Where CPU training gets its memory: tinygpt's caching allocator (tinygpt/csrc/caching_allocator.cpp), or
glibc's malloc told to keep freed blocks.

Why: a training step allocates the same tensors, of the same sizes, every step. glibc hands big freed blocks
back to the kernel, so every step faults its activations in again page by page (medium config: ~8k page
faults, 21-31 ms of kernel time a step). Told to keep blocks up to 32 MiB (`keep_freed_memory`, what the
trainer did before the allocator), it packs them into one heap that fragments where activations are big:
the large config with dropout 0.2 peaked at 4.1-4.4 GiB in fp32 against 2.6 GiB with glibc's defaults,
which in turn made its steps a third slower. The caching allocator keeps each freed block of 1 MiB or more
in a list of blocks of exactly its size and hands it to the next tensor of that size, so after the first
step nothing is mapped, faulted in or fragmented; live plus kept memory stays within twice the live peak.
Smaller tensors stay malloc's, told to keep freed blocks as above (the small config's activations are
under 1 MiB: left to glibc's defaults they were faulted in again at ~600 page faults a step, against 4-12).

Measured (`python bench/throughput.py`, fp32, this project's 2-core machine, two runs each, `--cpu-allocator
malloc` against the default): large config with dropout 0.2, peak 4463 / 4180 MiB and 6994 / 7230 ms a step
against 2863 / 2866 MiB and 7047 / 6954 ms; without dropout 3582 MiB 4432 ms against 2666-2671 MiB
4236-4257 ms; medium config 560 / 580 MiB 112.0 / 110.8 ms against 510 / 512 MiB 109.3 / 107.4 ms.

The trainer chooses on CPU with `--cpu-allocator` (`run.cpu_allocator`): `auto` (the default) installs the
caching allocator unless the user tunes malloc already (any MALLOC_* variable, malloc in GLIBC_TUNABLES, or
an allocator in LD_PRELOAD: then malloc stays as they set it) or it cannot be built (then a one-line note,
and malloc keeping freed blocks); `caching` makes a failed build an error; `malloc` is glibc with kept
blocks. It is built once per machine type like the kernels (tinygpt/native.py; a few seconds).
"""

from __future__ import annotations

import ctypes
import os

from . import native
from .config import CPU_ALLOCATOR_MODES

BUILD_STEM = "tinygpt_cpu_allocator"
SOURCES = ("caching_allocator.cpp",)
MODES = CPU_ALLOCATOR_MODES

_ext = None  # the loaded extension while the caching allocator serves CPU tensors, else None


class CpuAllocatorError(RuntimeError):
    """The caching allocator was asked for (`--cpu-allocator caching`) and cannot be built or installed."""


# glibc's mallopt: freed blocks up to 32 MiB (glibc's own ceiling for its adaptive threshold) stay in the heap
# for reuse and the heap top is not trimmed; bigger blocks are still mapped and returned.
MALLOC_MMAP_THRESHOLD, MALLOC_TRIM_THRESHOLD = -3, -1  # mallopt's parameter numbers (malloc.h)
KEEP_BLOCKS_UP_TO = 32 << 20
TRIM_ABOVE = 2**31 - 1  # the heap top goes back to the kernel only beyond 2 GiB free (mallopt takes an int)


def user_tunes_malloc() -> bool:
    """Whether the environment sets malloc up already (MALLOC_*_ or GLIBC_TUNABLES, or a preloaded allocator)."""
    return (any(k.startswith("MALLOC_") for k in os.environ) or "malloc" in os.environ.get("GLIBC_TUNABLES", "")
            or "alloc" in os.environ.get("LD_PRELOAD", ""))


def keep_freed_memory() -> bool:
    """Have glibc keep freed blocks for reuse; False where it did not apply (the user tunes malloc, or
    another C library)."""
    if user_tunes_malloc():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(MALLOC_MMAP_THRESHOLD, KEEP_BLOCKS_UP_TO) and mallopt(MALLOC_TRIM_THRESHOLD, TRIM_ABOVE))


def install(mode: str = "auto", say=print) -> str:
    """Set up CPU memory as `mode` asks: "caching" when the caching allocator now serves CPU tensors, else
    "malloc". `say` gets a line when it is built (once per machine type) and when `auto` falls back."""
    global _ext
    if mode not in MODES:
        raise ValueError(f"cpu_allocator: {mode!r} is not one of {', '.join(MODES)}")
    if _ext is not None and mode != "malloc":
        return "caching"
    uninstall()
    keep_freed_memory()  # malloc's blocks: all of them, or those under 1 MiB beside the caching allocator
    if mode == "malloc" or (mode == "auto" and user_tunes_malloc()):
        return "malloc"
    try:
        ext = native.load(BUILD_STEM, SOURCES, "tinygpt's CPU allocator", say, ["-O2"], takes="a few seconds")
        reason = None if ext.install() else "another allocator was installed with a higher priority"
    except Exception as err:  # a missing compiler or ninja, a read-only cache, a compile error
        reason = native.why(err)
    if reason is None:
        _ext = ext
        return "caching"
    if mode == "caching":
        raise CpuAllocatorError(f"cpu_allocator: caching, but the caching allocator (tinygpt/csrc) could not be "
                                f"set up: {reason}. Install a C++ compiler (g++) or use --cpu-allocator malloc")
    say(f"note: tinygpt's CPU allocator could not be set up ({reason}); using malloc, which keeps more memory "
        f"(--cpu-allocator malloc skips the attempt)")
    return "malloc"


def uninstall() -> None:
    """PyTorch's allocator serves CPU tensors again (blocks still in use are unmapped when freed)."""
    global _ext
    if _ext is not None:
        _ext.uninstall()
        _ext = None


def stats() -> dict[str, int] | None:
    """The caching allocator's counters in bytes (mapped, kept, live, their peaks, hits and misses), or None
    when it is not installed."""
    return dict(_ext.stats()) if _ext is not None else None


def empty_cache() -> int:
    """Unmap the blocks the caching allocator keeps; returns the bytes given back (0 when not installed)."""
    return _ext.empty_cache() if _ext is not None else 0
