"""Causal self-attention for the CPU in one C++ kernel (tinygpt/csrc/causal_attention.cpp).

Why: at TinyGPT's shapes PyTorch's CPU flash attention was the second biggest cost of a training step
after the matmuls (medium config: ~10 ms of forward + backward a layer against ~70 ms of matmuls for
the whole model), and around it the model paid for splitting qkv into heads, making the output
contiguous again and, in backward, concatenating the three gradients. This kernel reads the qkv
projection's output as it is, writes the attention output with the heads side by side (what the output
projection reads) and its gradient straight into one (B, T, 3C) tensor. Per (batch row, head) it keeps
the head's q, k, v and the (T, T) scores in a few buffers that fit in L2, computes only the causal
triangle, and backward recomputes the softmax from the saved log-sum-exp (as flash attention does), so
it keeps only y and one float per row. Forward + backward of one layer through autograd on this project's
2-core machine (`python bench/attention.py`: medians of rounds, over three runs), this kernel against
SDPA with the split, transposes and copies it needs: B32 T128 C128 (medium) 5.0-5.9 ms against 7.9-9.3;
B12 T64 C128 (small) 0.79-1.03 against 1.10-1.48; B64 T256 C384 (large) 112-161 against 160-214.

It is fp32 only and for heads of a multiple of 16 channels, up to 512 positions, without attention
dropout; everything else (dropout, CUDA, other head sizes, longer sequences) goes through
`F.scaled_dot_product_attention` or `tinygpt.kernels.dropout_attention` as before. Results match those
within float rounding (tests compare both with an fp64 reference) and are bit-for-bit the same from run
to run and for any thread count: one thread computes a whole head, in a fixed order.

Built on first use with the machine's C++ compiler (torch.utils.cpp_extension, ninja) for the CPU it
runs on (-march=native); the build takes about half a minute and is cached under
$TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions), one build per CPU model and torch version,
so a home directory shared by different nodes stays correct. The trainer asks for it on CPU
(`--cpu-attention auto`, the default) and falls back to SDPA with a one-line note if it cannot be built;
`--cpu-attention fused` makes that an error, `--cpu-attention sdpa` never builds it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import time
from pathlib import Path

import torch

SOURCE = Path(__file__).resolve().parent / "csrc" / "causal_attention.cpp"
MODES = ("auto", "fused", "sdpa")
# Longer sequences go to SDPA: a thread's two (T, T) buffers outgrow L2, and PyTorch's flash kernel, which
# works in blocks, catches up (measured forward + backward: T 512 fused 20-23 ms vs 20-27; T 1024, width
# 128, fused 44-46 vs 36-42).
MAX_BLOCK_SIZE = 512
STALE_LOCK_S = 600  # a build takes about 30 s; a lock file this old was left by a build that died

_ext = None  # the loaded extension while the fused kernel is in use, else None


class CpuAttentionError(RuntimeError):
    """The fused kernel was asked for (`--cpu-attention fused`) and cannot be built or loaded."""


def _cpu_signature() -> str:
    """What -march=native compiles for: the CPU's model and flags, plus the torch it links against."""
    text = ""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        pass
    lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features", "CPU part"))]
    seen = "\n".join(dict.fromkeys(lines))  # the same for every core
    return hashlib.sha1(f"{platform.machine()}\n{torch.__version__}\n{seen}".encode()).hexdigest()[:12]


def _flags() -> list[str]:
    flags = ["-O3", "-march=native", "-fopenmp"]  # OpenMP: at::parallel_for uses torch's thread pool
    if platform.machine() in ("x86_64", "AMD64"):
        flags.append("-mprefer-vector-width=512")  # use AVX-512 where the CPU has it (GCC prefers 256)
    return flags


def _ninja_on_path() -> None:
    """torch builds with ninja; the pip package puts it in the venv's bin, which may not be on PATH."""
    if shutil.which("ninja"):
        return
    try:
        import ninja  # the pip package: a dependency of this project
    except ImportError:
        return
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def build_directory() -> Path:
    from torch.utils.cpp_extension import get_default_build_root

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    return Path(root) / f"tinygpt_cpu_attention_{_cpu_signature()}"


def _clear_stale_lock(directory: Path, say) -> None:
    """torch holds a `lock` file in the build directory while it builds and waits, without end, for
    whoever holds it. A build killed midway (a job at its time limit) leaves it behind; remove it once
    it is far older than a build takes, or every later run would wait forever."""
    lock = directory / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if age > STALE_LOCK_S:
        say(f"note: removing {lock}, left {age / 60:.0f} min ago by a build that did not finish")
        lock.unlink(missing_ok=True)


def _load(directory: Path, say):
    from torch.utils.cpp_extension import load

    _ninja_on_path()
    directory.mkdir(parents=True, exist_ok=True)
    _clear_stale_lock(directory, say)
    # torch warns at length about any compiler that is not g++ (clang++ works as well); a failed build
    # is reported by activate() in one line.
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        return load(name=directory.name, sources=[str(SOURCE)], extra_cflags=_flags(), extra_ldflags=["-fopenmp"],
                    build_directory=str(directory), verbose=False)
    finally:
        logger.setLevel(level)


def _why(err: Exception) -> str:
    """The compiler's own words from a failed build, without ninja's progress and command lines."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    kept = [ln for ln in lines if not ln.startswith(("[", "FAILED:", "Error building extension")) and " -o " not in ln]
    return "; ".join(kept[:4] or lines[-1:])[:300].rstrip(".")


def activate(mode: str = "auto", say=print) -> str:
    """Use the fused kernel for CPU attention from now on, if `mode` allows and it builds.

    Returns what CPU attention will use, "fused" or "sdpa". `say` gets one line when the kernel is
    built (slow, once per machine type) and when `auto` falls back to SDPA.
    """
    global _ext
    if mode not in MODES:
        raise ValueError(f"cpu_attention: {mode!r} is not one of {', '.join(MODES)}")
    if mode == "sdpa":
        _ext = None
        return "sdpa"
    if _ext is not None:
        return "fused"
    directory = build_directory()
    fresh = not any(directory.glob("*.so"))
    if fresh:
        say(f"building the fused CPU attention kernel for this CPU (once; about 30 s) in {directory}")
    started = time.perf_counter()
    try:
        _ext = _load(directory, say)
    except Exception as err:  # a missing compiler or ninja, a read-only cache, a compile error
        reason = _why(err)
        if mode == "fused":
            raise CpuAttentionError(
                f"cpu_attention: fused, but the kernel ({SOURCE.name}) could not be built: {reason}. "
                f"Install a C++ compiler (g++) or use --cpu-attention sdpa") from None
        say(f"note: the fused CPU attention kernel could not be built ({reason}); using PyTorch's SDPA, "
            f"which is slower on CPU (--cpu-attention sdpa skips the attempt)")
        return "sdpa"
    took = time.perf_counter() - started
    if fresh or took > 5:  # also a rebuild: torch rebuilds when the source or the compiler flags changed
        say(f"built the fused CPU attention kernel in {took:.0f} s")
    return "fused"


def deactivate() -> None:
    global _ext
    _ext = None


def unsupported(head_size: int, block_size: int) -> str | None:
    """Why the kernel cannot take a model with these heads and this context, or None if it can."""
    if head_size % 16:
        return f"heads of {head_size} channels (n_embd / n_head); the kernel takes multiples of 16"
    if block_size > MAX_BLOCK_SIZE:
        return f"block_size {block_size}; the kernel takes at most {MAX_BLOCK_SIZE} positions"
    return None


def usable(qkv: torch.Tensor, n_head: int, dropout_p: float) -> bool:
    """Whether `causal_attention` takes this call (else the caller uses SDPA)."""
    return (_ext is not None and qkv.device.type == "cpu" and dropout_p == 0.0 and qkv.dim() == 3
            and unsupported(qkv.size(2) // 3 // n_head, qkv.size(1)) is None)


@torch.library.custom_op("tinygpt::causal_attention", mutates_args=())
def _forward(qkv: torch.Tensor, n_head: int) -> tuple[torch.Tensor, torch.Tensor]:
    y, lse = _ext.forward(qkv, n_head)
    return y, lse


@_forward.register_fake
def _(qkv, n_head):
    B, T, C3 = qkv.shape
    return qkv.new_empty(B, T, C3 // 3), qkv.new_empty(B, n_head, T)


@torch.library.custom_op("tinygpt::causal_attention_backward", mutates_args=())
def _backward(qkv: torch.Tensor, y: torch.Tensor, lse: torch.Tensor, dy: torch.Tensor,
              n_head: int) -> torch.Tensor:
    return _ext.backward(qkv, y, lse, dy, n_head)


@_backward.register_fake
def _(qkv, y, lse, dy, n_head):
    return torch.empty_like(qkv)


def _setup_context(ctx, inputs, output):
    qkv, n_head = inputs
    y, lse = output
    ctx.save_for_backward(qkv, y, lse)
    ctx.n_head = n_head


def _autograd_backward(ctx, dy, _dlse):
    qkv, y, lse = ctx.saved_tensors
    return _backward(qkv, y, lse, dy.contiguous(), ctx.n_head), None


_forward.register_autograd(_autograd_backward, setup_context=_setup_context)


def causal_attention(qkv: torch.Tensor, n_head: int) -> torch.Tensor:
    """Causal softmax attention of the heads in qkv (B, T, 3C), q | k | v: the output (B, T, C), heads
    side by side. fp32; check `usable` first."""
    y, _ = _forward(qkv.contiguous(), n_head)
    return y
