"""tinygpt's CPU kernels in C++ (tinygpt/csrc/): causal attention, LayerNorm with the residual add, GELU.

Why: at TinyGPT's sizes a CPU training step is matmuls (MKL, about two thirds of the time) plus a tail of
small operations that PyTorch runs one pass over memory at a time. Three of them are worth a kernel:

* Attention (csrc/causal_attention.cpp). PyTorch's CPU flash attention was the second biggest cost
  after the matmuls (medium config: ~10 ms of forward + backward a layer against ~70 ms of matmuls for
  the whole model), and around it the model paid for splitting qkv into heads, making the output
  contiguous again and, in backward, concatenating the three gradients. This kernel reads the qkv
  projection's output as it is, writes the attention output with the heads side by side (what the output
  projection reads) and its gradient straight into one (B, T, 3C) tensor. Per (batch row, head) it keeps
  the head's q, k, v and the (T, T) scores in a few buffers that fit in L2, computes only the causal
  triangle, and backward recomputes the softmax from the saved log-sum-exp (as flash attention does), so
  it keeps only y and one float per row.
* LayerNorm with the residual add before it (csrc/layer_norm.cpp): s = x + delta, y = LN(s), each row
  read and written once, and in backward the norm's gradient and the residual's in one pass. The model
  defers each block's last add to the next LayerNorm (`Block.step`), so every add fuses.
* GELU with its slope (csrc/gelu.cpp): forward writes gelu(h) and gelu'(h), the same erf and exp
  serving both, and backward is one multiplication (PyTorch's recomputes erf and exp from h).

`python bench/cpu_kernels.py` (forward + backward through autograd, medians of rounds, ms; this project's
2-core machine, over two sessions): medium config (B32 T128 C128) attention 5.0-7.3 against 7.9-12.6 for
SDPA with the split, transposes and copies it needs; add + LayerNorm 0.79-0.91 against 1.12-1.19; GELU
2.31-2.47 against 2.41-2.81 (one round 4.43 in a busy moment). Small config (B12 T64 C128): 0.86-1.06
against 1.30-1.58; 0.32-0.44 against 0.35-0.44; 0.55-0.69 against 0.71-0.90. Large (B64 T256 C384):
attention 112-165 against 160-214; add + LayerNorm 13.2-13.8 against 18.0-18.1.
A training step of the medium config, one process alternating steps with the LayerNorm and GELU kernels on
and off: 4% faster (median of the pairwise differences 6.4 ms of ~160, on faster in 75% of 60 pairs; GELU's
share about 2 ms); all three on against all off: 10% (22 ms of ~200, 83% of 60 pairs, a busy hour).

They compute in fp32 (under bf16 autocast too, for attention and LayerNorm, as PyTorch's run there), each
only where its shapes fit (attention: heads of a multiple of 16 channels, up to 512 positions, no attention
dropout; LayerNorm: widths of a multiple of 16; GELU: fp32 inputs, so not the MLP's hidden layer under bf16
autocast); everything else runs through PyTorch as before. Results match
PyTorch's within float rounding (tests compare both with an fp64 reference) and are bit-for-bit the same
from run to run and for any thread count (work is split so that no sum depends on the split).

Built on first use with the machine's C++ compiler (tinygpt/native.py) for the CPU it runs on
(-march=native); the build takes about a minute and is cached under $TORCH_EXTENSIONS_DIR
(default ~/.cache/torch_extensions), one build per CPU model and torch version, so a home directory shared
by different nodes stays correct. The trainer asks for them on CPU (`--cpu-kernels auto`, the default) and
falls back to PyTorch's operations with a one-line note if they cannot be built; `--cpu-kernels on` makes
that an error, `--cpu-kernels off` never builds them.
"""

from __future__ import annotations

import platform
from pathlib import Path

import torch

from . import native
from .config import CPU_KERNEL_MODES

BUILD_STEM = "tinygpt_cpu_kernels"
SOURCES = ("module.cpp", "causal_attention.cpp", "layer_norm.cpp", "gelu.cpp")  # and kernels.h
MODES = CPU_KERNEL_MODES
KERNELS = ("attention", "layer_norm", "gelu")
# Longer sequences go to SDPA: a thread's two (T, T) buffers outgrow L2, and PyTorch's flash kernel, which
# works in blocks, catches up (measured forward + backward: T 512 fused 20-23 ms vs 20-27; T 1024, width
# 128, fused 44-46 vs 36-42).
MAX_BLOCK_SIZE = 512
VECTOR = 16  # floats in one of csrc/kernels.h's vectors: head sizes and widths must be multiples of it

_ext = None  # the loaded extension while the kernels are in use, else None


class CpuKernelsError(RuntimeError):
    """The kernels were asked for (`--cpu-kernels on`) and cannot be built or loaded."""


def _flags() -> list[str]:
    flags = ["-O3", "-march=native", "-fopenmp"]  # OpenMP: at::parallel_for uses torch's thread pool
    if platform.machine() in ("x86_64", "AMD64"):
        flags.append("-mprefer-vector-width=512")  # use AVX-512 where the CPU has it (GCC prefers 256)
    return flags


def build_directory() -> Path:
    return native.build_directory(BUILD_STEM)


def activate(mode: str = "auto", say=print) -> bool:
    """Use the kernels from now on, if `mode` allows and they build; returns whether they are in use.

    `say` gets one line when they are built (slow, once per machine type) and when `auto` falls back to
    PyTorch's operations.
    """
    global _ext
    if mode not in MODES:
        raise ValueError(f"cpu_kernels: {mode!r} is not one of {', '.join(MODES)}")
    if mode == "off":
        _ext = None
        return False
    if _ext is not None:
        return True
    try:
        _ext = native.load(BUILD_STEM, SOURCES, "tinygpt's CPU kernels", say, _flags(), ["-fopenmp"])
    except Exception as err:  # a missing compiler or ninja, a read-only cache, a compile error
        reason = native.why(err)
        if mode == "on":
            raise CpuKernelsError(
                f"cpu_kernels: on, but the kernels (tinygpt/csrc) could not be built: {reason}. "
                f"Install a C++ compiler (g++) or use --cpu-kernels off") from None
        say(f"note: tinygpt's CPU kernels could not be built ({reason}); using PyTorch's operations, "
            f"which are slower on CPU (--cpu-kernels off skips the attempt)")
        return False
    return True


def deactivate() -> None:
    global _ext
    _ext = None


def unsupported(kernel: str, n_embd: int, n_head: int, block_size: int) -> str | None:
    """Why `kernel` cannot take a model of this shape, or None if it can (in fp32)."""
    if kernel == "attention":
        head_size = n_embd // n_head
        if head_size % VECTOR:
            return f"heads of {head_size} channels (n_embd / n_head); the kernel takes multiples of {VECTOR}"
        if block_size > MAX_BLOCK_SIZE:
            return f"block_size {block_size}; the kernel takes at most {MAX_BLOCK_SIZE} positions"
    elif kernel == "layer_norm" and n_embd % VECTOR:
        return f"width {n_embd} (n_embd); the kernel takes multiples of {VECTOR}"
    return None


# Each kernel is called two ways. Eagerly through a torch.autograd.Function that calls the extension
# directly: torch.library's custom ops cost about 0.2 ms of Python a forward + backward, as much as the
# LayerNorm kernel itself at the small config. Under torch.compile as a custom op (below each Function),
# which the compiler traces through its fake implementation instead of breaking the graph.


def _compiling() -> bool:
    return torch.compiler.is_compiling()


# --- attention ---------------------------------------------------------------------------------------

def attention_usable(qkv: torch.Tensor, n_head: int, dropout_p: float) -> bool:
    """Whether `causal_attention` takes this call (else the caller uses SDPA)."""
    return (_ext is not None and qkv.device.type == "cpu" and dropout_p == 0.0 and qkv.dim() == 3
            and unsupported("attention", qkv.size(2) // 3, n_head, qkv.size(1)) is None)


def _attention_save(ctx, qkv, n_head, y, lse):
    ctx.save_for_backward(qkv, y, lse)
    ctx.n_head = n_head


def _attention_grads(ctx, dy, backward):
    """Gradients of (qkv, n_head) from y's, by `backward` (the extension's, or its custom op)."""
    qkv, y, lse = ctx.saved_tensors
    return backward(qkv, y, lse, dy.contiguous(), ctx.n_head), None


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, n_head):
        y, lse = _ext.attention_forward(qkv, n_head)
        _attention_save(ctx, qkv, n_head, y, lse)
        return y

    @staticmethod
    def backward(ctx, dy):
        return _attention_grads(ctx, dy, _ext.attention_backward)


@torch.library.custom_op("tinygpt::causal_attention", mutates_args=())
def _attention_op(qkv: torch.Tensor, n_head: int) -> tuple[torch.Tensor, torch.Tensor]:
    y, lse = _ext.attention_forward(qkv, n_head)
    return y, lse


@_attention_op.register_fake
def _(qkv, n_head):
    B, T, C3 = qkv.shape
    return qkv.new_empty(B, T, C3 // 3), qkv.new_empty(B, n_head, T)


@torch.library.custom_op("tinygpt::causal_attention_backward", mutates_args=())
def _attention_backward_op(qkv: torch.Tensor, y: torch.Tensor, lse: torch.Tensor, dy: torch.Tensor,
                           n_head: int) -> torch.Tensor:
    return _ext.attention_backward(qkv, y, lse, dy, n_head)


@_attention_backward_op.register_fake
def _(qkv, y, lse, dy, n_head):
    return torch.empty_like(qkv)


def _attention_setup(ctx, inputs, output):
    _attention_save(ctx, *inputs, *output)


def _attention_grad(ctx, dy, _dlse):
    return _attention_grads(ctx, dy, _attention_backward_op)


_attention_op.register_autograd(_attention_grad, setup_context=_attention_setup)


def causal_attention(qkv: torch.Tensor, n_head: int) -> torch.Tensor:
    """Causal softmax attention of the heads in qkv (B, T, 3C), q | k | v: the output (B, T, C), heads
    side by side. fp32; check `attention_usable` first."""
    qkv = qkv.contiguous()
    if _compiling():
        return _attention_op(qkv, n_head)[0]
    return _Attention.apply(qkv, n_head)


# --- residual add + LayerNorm -----------------------------------------------------------------------

class _AddLayerNorm(torch.autograd.Function):
    """(s, y) with a delta; only y without one (s would be x itself, whose other uses autograd tracks)."""

    @staticmethod
    def forward(ctx, x, delta, weight, bias, eps):
        s, y, mean, rstd = _ext.add_layer_norm_forward(x, delta, weight, bias, eps)
        _add_layer_norm_save(ctx, x, delta, weight, bias, s, mean, rstd)
        return (s, y) if delta is not None else y

    @staticmethod
    def backward(ctx, *grads):
        ds, dy = grads if ctx.has_delta else (None, grads[0])
        return _add_layer_norm_grads(ctx, ds, dy, _ext.add_layer_norm_backward)


def _add_layer_norm_save(ctx, x, delta, weight, bias, s, mean, rstd):
    ctx.save_for_backward(x if delta is None else s, mean, rstd, weight)  # s is empty without a delta
    ctx.has_delta, ctx.has_bias = delta is not None, bias is not None


def _add_layer_norm_grads(ctx, ds, dy, backward):
    """Gradients of (x, delta, weight, bias, eps) from those of s and y. Without a delta the caller's s
    is x itself, not an output: autograd adds x's gradient from the stream, and ds is not used."""
    s, mean, rstd, weight = ctx.saved_tensors
    ds = ds.contiguous() if ctx.has_delta and ds is not None else None
    dx, dweight, dbias = backward(dy.contiguous(), ds, s, mean, rstd, weight)
    return dx, (dx if ctx.has_delta else None), dweight, (dbias if ctx.has_bias else None), None


@torch.library.custom_op("tinygpt::add_layer_norm", mutates_args=())
def _add_layer_norm_op(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                       bias: torch.Tensor | None, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                         torch.Tensor]:
    s, y, mean, rstd = _ext.add_layer_norm_forward(x, delta, weight, bias, eps)
    return s, y, mean, rstd


@_add_layer_norm_op.register_fake
def _(x, delta, weight, bias, eps):
    rows = x.numel() // x.size(-1)
    return (x.new_empty(x.shape if delta is not None else (0,)), torch.empty_like(x), x.new_empty(rows),
            x.new_empty(rows))


@torch.library.custom_op("tinygpt::add_layer_norm_backward", mutates_args=())
def _add_layer_norm_backward_op(dy: torch.Tensor, ds: torch.Tensor | None, s: torch.Tensor, mean: torch.Tensor,
                                rstd: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                                   torch.Tensor]:
    dx, dweight, dbias = _ext.add_layer_norm_backward(dy, ds, s, mean, rstd, weight)
    return dx, dweight, dbias


@_add_layer_norm_backward_op.register_fake
def _(dy, ds, s, mean, rstd, weight):
    return torch.empty_like(s), torch.empty_like(weight), torch.empty_like(weight)


def _add_layer_norm_setup(ctx, inputs, output):
    x, delta, weight, bias, _eps = inputs
    s, _y, mean, rstd = output
    _add_layer_norm_save(ctx, x, delta, weight, bias, s, mean, rstd)


def _add_layer_norm_op_grad(ctx, ds, dy, _dmean, _drstd):
    return _add_layer_norm_grads(ctx, ds, dy, _add_layer_norm_backward_op)


_add_layer_norm_op.register_autograd(_add_layer_norm_op_grad, setup_context=_add_layer_norm_setup)


def add_layer_norm(x: torch.Tensor, delta: torch.Tensor | None, norm: torch.nn.LayerNorm):
    """(s, norm(s)) for s = x + delta (delta None: s = x), in one pass when the kernel takes it."""
    if (_ext is None or x.device.type != "cpu" or x.dtype != torch.float32 or norm.weight is None
            or norm.weight.dtype != torch.float32 or len(norm.normalized_shape) != 1
            or x.size(-1) % VECTOR or (delta is not None and delta.shape != x.shape)):
        s = x if delta is None else x + delta
        return s, norm(s)
    x = x.contiguous()
    if delta is not None:
        delta = delta.float().contiguous()  # the attention's / MLP's output is bf16 under autocast
    if _compiling():
        s, y, _, _ = _add_layer_norm_op(x, delta, norm.weight, norm.bias, norm.eps)
        return (x if delta is None else s), y
    if delta is None:
        return x, _AddLayerNorm.apply(x, None, norm.weight, norm.bias, norm.eps)
    return _AddLayerNorm.apply(x, delta, norm.weight, norm.bias, norm.eps)


# --- GELU ----------------------------------------------------------------------------------------------

class _Gelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h):
        g, slope = _ext.gelu_and_slope(h)
        ctx.save_for_backward(slope)
        return g

    @staticmethod
    def backward(ctx, dg):
        (slope,) = ctx.saved_tensors
        return dg * slope


@torch.library.custom_op("tinygpt::gelu_and_slope", mutates_args=())
def _gelu_op(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    g, slope = _ext.gelu_and_slope(h)
    return g, slope


@_gelu_op.register_fake
def _(h):
    return torch.empty_like(h), torch.empty_like(h)


def _gelu_setup(ctx, inputs, output):
    ctx.save_for_backward(output[1])


def _gelu_op_grad(ctx, dg, _dslope):
    return _Gelu.backward(ctx, dg)


_gelu_op.register_autograd(_gelu_op_grad, setup_context=_gelu_setup)


def gelu_usable(h: torch.Tensor) -> bool:
    return _ext is not None and h.device.type == "cpu" and h.dtype == torch.float32


def gelu_and_slope(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """gelu(h) and gelu'(h) (no autograd: for backward functions that recompute GELU); check `gelu_usable`."""
    h = h.contiguous()
    return _gelu_op(h) if _compiling() else tuple(_ext.gelu_and_slope(h))


def gelu(h: torch.Tensor) -> torch.Tensor:
    """The exact GELU; in one pass with its slope (kept for backward) when the kernel takes h and a
    gradient is wanted (without one the slope would be wasted: PyTorch's GELU then)."""
    if not (gelu_usable(h) and h.requires_grad and torch.is_grad_enabled()):
        return torch.nn.functional.gelu(h)
    h = h.contiguous()
    return _gelu_op(h)[0] if _compiling() else _Gelu.apply(h)
