"""tinygpt's CPU kernels (tinygpt/cpu_kernels.py) against the PyTorch operations they replace, forward +
backward through autograd at the presets' shapes.

    python bench/cpu_kernels.py                    # the small, medium and large presets
    python bench/cpu_kernels.py --preset medium --rounds 3

Each pair computes the same thing the way the model does with the kernels off and on:
  attention   SDPA with the split of qkv into heads, the transposes and the copy back it needs,
              against the kernel straight from qkv (B, T, 3C);
  layer_norm  x + delta, then LayerNorm, against the fused add + LayerNorm (B*T rows of C);
  gelu        F.gelu against GELU with its slope kept for backward (B*T rows of 4C), where the model
              uses it: for the large config's 96 MiB hidden layer it recomputes GELU in backward
              instead (tinygpt/kernels.py: gelu_linear), not measured here.
Prints one JSON line per preset and operation: the median ms of each round (the machine is noisy:
rounds alternate the two ways).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from common import PRESETS


def median_ms(fn, inputs, grads, reps: int) -> float:
    """Median ms of fn(*inputs) and its backward with `grads`, after 3 warm-up calls."""
    import torch

    def once():
        out = fn(*inputs)
        out = out if isinstance(out, tuple) else (out,)
        torch.autograd.backward(out, grads)

    for _ in range(3):
        once()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    return round(1000 * statistics.median(times), 3)


def cases(preset: dict):
    """(name, PyTorch's way, the kernel's way, inputs, output gradients) for one preset's shapes."""
    import torch
    import torch.nn.functional as F

    from tinygpt import cpu_kernels, kernels

    B, T, C, H = preset["batch_size"], preset["block_size"], preset["n_embd"], preset["n_head"]

    def sdpa(qkv):
        q, k, v = (t.view(B, T, H, -1).transpose(1, 2) for t in qkv.split(C, dim=2))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)

    qkv = torch.randn(B, T, 3 * C, requires_grad=True)
    yield ("attention", sdpa, lambda qkv: cpu_kernels.causal_attention(qkv, H), [qkv], [torch.randn(B, T, C)])

    norm = torch.nn.LayerNorm(C, bias=False)

    def add_norm(x, delta):
        s = x + delta
        return s, norm(s)

    x, delta = (torch.randn(B, T, C, requires_grad=True) for _ in range(2))
    yield ("layer_norm", add_norm, lambda x, delta: cpu_kernels.add_layer_norm(x, delta, norm), [x, delta],
           [torch.randn(B, T, C), torch.randn(B, T, C)])

    h = torch.randn(B, T, 4 * C, requires_grad=True)
    if h.numel() * h.element_size() < kernels.GELU_RECOMPUTE_BYTES:  # bigger: the model recomputes GELU
        yield ("gelu", F.gelu, cpu_kernels.gelu, [h], [torch.randn(B, T, 4 * C)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", action="append", choices=sorted(PRESETS), help="default: small, medium, large")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    import torch

    from tinygpt import cpu_allocator, cpu_kernels

    cpu_allocator.install("auto")  # as the trainer does: freed blocks are reused, not faulted in again every call
    assert cpu_kernels.activate("on")
    for name in args.preset or ["small", "medium", "large"]:
        preset = PRESETS[name]
        reps = 15 if preset["block_size"] * preset["n_embd"] < 256 * 384 else 5
        for op, plain, kernel, inputs, grads in cases(preset):
            result = {"preset": name, "op": op, "shape": [preset[k] for k in ("batch_size", "block_size", "n_embd")],
                      "threads": torch.get_num_threads(), "pytorch_ms": [], "kernel_ms": []}
            for _ in range(args.rounds):
                result["pytorch_ms"].append(median_ms(plain, inputs, grads, reps))
                result["kernel_ms"].append(median_ms(kernel, inputs, grads, reps))
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
