"""Hand-written forward/backward pairs that keep less for backward than the plain PyTorch ops.

Training memory is mostly what autograd keeps from forward for backward. In three places the plain
ops keep more than they need to; each function here computes exactly the same values and gradients with
less kept (tests/test_kernels.py compares them with the plain ops):

* `dropout_attention`: causal attention with dropout, in blocks. PyTorch's fused CPU attention (flash)
  has no dropout, so `F.scaled_dot_product_attention(dropout_p > 0)` falls back to the plain math and
  keeps the scores, the softmax and the dropped-out softmax: three float (B, heads, T, T) tensors a
  layer, 2.7 GB of the large config's 6.7 GB. Here only q, k, v and the dropout mask (as booleans) are
  kept; backward recomputes each block's softmax from q and k, as flash attention does.
* `dropout`: PyTorch's CPU dropout keeps its mask as floats; `torch.native_dropout` (what CUDA uses)
  keeps booleans, a quarter of the size.
* `gelu_linear`: proj(gelu(h)) keeps h only. Plain autograd keeps both h (for GELU's backward) and
  gelu(h) (for the projection's), each 4 x n_embd wide; gelu(h) is recomputed in backward instead, one
  elementwise op. Only where h is big enough for its memory to matter (`GELU_RECOMPUTE_BYTES`): on the
  medium config the recompute costs about 4% of a step and saves 32 MB.

Randomness comes from the default generator, like every other dropout: seeded runs, exact resume and
activation checkpointing (which restores the RNG state before recomputing) see the same masks.

The attention maths, with P the softmax, M the keep mask and 1-p the keep probability:

    out = (P * M / (1-p)) v              dv = (P * M / (1-p))^T dout
    dP  = (dout v^T) * M / (1-p)         dS = P * (dP - rowsum(dP * P))
    dq  = dS k / sqrt(d)                 dk = dS^T q / sqrt(d)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import cpu_kernels

# A block of heads whose (T, T) matrices take about this many bytes: small enough to stay in cache.
BLOCK_BYTES = 4 * 2**20


def _heads_per_block(T: int, element_size: int) -> int:
    return max(1, BLOCK_BYTES // (T * T * element_size))


class _DropoutAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, p: float, heads_per_block: int):
        B, H, T, D = q.shape
        keep_prob = 1.0 - p
        # The softmax scale goes into q and the dropout factor 1/(1-p) into v: (B*H, T, D) tensors, not (T, T).
        qs = q.reshape(B * H, T, D) * (1.0 / math.sqrt(D))
        kf = k.reshape(B * H, T, D)
        vs = v.reshape(B * H, T, D) * (1.0 / keep_prob)
        causal = _causal_bias(T, q)
        dropped = torch.empty(B * H, T, T, dtype=torch.bool, device=q.device)
        out = torch.empty_like(qs)
        for i in range(0, B * H, heads_per_block):
            j = min(i + heads_per_block, B * H)
            probs = torch.baddbmm(causal, qs[i:j], kf[i:j].transpose(1, 2)).softmax(dim=-1)
            torch.ge(torch.rand_like(probs), keep_prob, out=dropped[i:j])
            torch.bmm(probs.masked_fill_(dropped[i:j], 0.0), vs[i:j], out=out[i:j])
        ctx.save_for_backward(qs, kf, vs, dropped)
        ctx.keep_prob, ctx.heads_per_block, ctx.shape = keep_prob, heads_per_block, (B, H, T, D)
        return out.view(B, H, T, D)

    @staticmethod
    def backward(ctx, dout):
        # Forward ran without autocast (its inputs' dtype throughout); so must backward. Eager autograd
        # runs backward outside autocast anyway, but a compiled graph traces it under the caller's
        # autocast, which would turn these bmms bf16 against their fp32 `out=` buffers.
        with torch.autocast(dout.device.type, enabled=False):
            return _DropoutAttention._backward(ctx, dout)

    @staticmethod
    def _backward(ctx, dout):
        qs, kf, vs, dropped = ctx.saved_tensors
        B, H, T, D = ctx.shape
        do = dout.reshape(B * H, T, D)
        causal = _causal_bias(T, qs)
        dq, dk, dv = torch.empty_like(qs), torch.empty_like(kf), torch.empty_like(vs)
        for i in range(0, B * H, ctx.heads_per_block):
            j = min(i + ctx.heads_per_block, B * H)
            probs = torch.baddbmm(causal, qs[i:j], kf[i:j].transpose(1, 2)).softmax(dim=-1)
            torch.bmm(probs.masked_fill(dropped[i:j], 0.0).transpose(1, 2), do[i:j], out=dv[i:j])
            dprobs = torch.bmm(do[i:j], vs[i:j].transpose(1, 2)).masked_fill_(dropped[i:j], 0.0)
            dscores = dprobs.sub_((dprobs * probs).sum(dim=-1, keepdim=True)).mul_(probs)
            torch.bmm(dscores, kf[i:j], out=dq[i:j])
            torch.bmm(dscores.transpose(1, 2), qs[i:j], out=dk[i:j])
        # dP used vs, which carries 1/(1-p); dv needs it too; dk got q's scale from qs, dq gets it here.
        dv.mul_(1.0 / ctx.keep_prob)
        dq.mul_(1.0 / math.sqrt(D))
        return dq.view(B, H, T, D), dk.view(B, H, T, D), dv.view(B, H, T, D), None, None


def _causal_bias(T: int, like: torch.Tensor) -> torch.Tensor:
    """(T, T): 0 where a query may look (itself and the past), -inf on the future."""
    return torch.full((T, T), float("-inf"), dtype=like.dtype, device=like.device).triu_(1)


def dropout_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: float,
                      heads_per_block: int | None = None) -> torch.Tensor:
    """Causal softmax attention with dropout p on the attention weights; q, k, v: (B, heads, T, d)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"dropout_attention needs 0 < p < 1, got {p}")
    if heads_per_block is None:
        heads_per_block = _heads_per_block(q.size(2), q.element_size())
    with torch.autocast(q.device.type, enabled=False):  # in q's dtype throughout, also under autocast
        return _DropoutAttention.apply(q, k, v, p, heads_per_block)


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout that keeps a boolean mask for backward (PyTorch's CPU dropout keeps a float one)."""
    if not training or p == 0.0:
        return x
    return torch.native_dropout(x, p, True)[0]


class _GeluLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, bias):
        # Under autocast the linear runs in the autocast dtype; backward repeats the casts by hand.
        g = F.gelu(h)
        out = F.linear(g, weight, bias)
        ctx.save_for_backward(h, weight)
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    def backward(ctx, dout):
        h, weight = ctx.saved_tensors
        if cpu_kernels.gelu_usable(h):  # gelu(h) and its slope in one pass over h
            g, slope = cpu_kernels.gelu_and_slope(h)
        else:
            g, slope = F.gelu(h), None
        g = g.to(dout.dtype)  # recomputed: the one tensor this function does not keep
        d2 = dout.reshape(-1, dout.size(-1))
        dweight = (d2.t() @ g.reshape(-1, g.size(-1))).to(weight.dtype)
        dbias = d2.sum(0).to(weight.dtype) if ctx.has_bias else None
        del g  # before dg exists: at most two h-sized tensors at a time here
        dg = (dout @ weight.to(dout.dtype)).to(h.dtype)
        dh = dg.mul_(slope) if slope is not None else torch.ops.aten.gelu_backward(dg, h)  # dg: ours to reuse
        return dh, dweight, dbias


# gelu(h) is recomputed in backward when h takes at least this much (the large config: 96 MB a layer).
GELU_RECOMPUTE_BYTES = 32 * 2**20


def gelu_linear(h: torch.Tensor, linear: torch.nn.Linear) -> torch.Tensor:
    """linear(gelu(h)), keeping only h for backward when h is big."""
    if not torch.is_grad_enabled() or h.numel() * h.element_size() < GELU_RECOMPUTE_BYTES:
        return linear(cpu_kernels.gelu(h))
    return _GeluLinear.apply(h, linear.weight, linear.bias)
