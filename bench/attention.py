"""CPU attention, forward + backward of one layer: the fused C++ kernel against PyTorch's SDPA.

    python bench/attention.py                 # the small, medium and large presets' shapes
    python bench/attention.py --rounds 3

Both through autograd, as the model calls them: SDPA with the split of qkv into heads, the transposes
and the copy back that it needs; the kernel straight from qkv (tinygpt/cpu_attention.py). Prints one
JSON line per shape: the median ms of each round (the machine is noisy: rounds alternate the two).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from common import PRESETS


def median_ms(attend, qkv, n_head: int, dy, reps: int) -> float:
    """Median ms of attend(qkv, n_head).backward(dy) after 3 warm-up calls."""
    for _ in range(3):
        attend(qkv, n_head).backward(dy)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        attend(qkv, n_head).backward(dy)
        times.append(time.perf_counter() - t0)
    return round(1000 * statistics.median(times), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", action="append", choices=sorted(PRESETS), help="default: small, medium, large")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    import torch
    import torch.nn.functional as F

    from tinygpt import cpu_attention

    assert cpu_attention.activate("fused") == "fused"

    def sdpa(qkv, n_head):
        B, T, C3 = qkv.shape
        q, k, v = (t.view(B, T, n_head, -1).transpose(1, 2) for t in qkv.split(C3 // 3, dim=2))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C3 // 3)

    for name in args.preset or ["small", "medium", "large"]:
        p = PRESETS[name]
        B, T, C, H = p["batch_size"], p["block_size"], p["n_embd"], p["n_head"]
        qkv = torch.randn(B, T, 3 * C, requires_grad=True)
        dy = torch.randn(B, T, C)
        reps = 15 if T * C < 256 * 384 else 5
        result = {"preset": name, "shape": [B, T, C, H], "threads": torch.get_num_threads(), "sdpa_ms": [],
                  "fused_ms": []}
        for _ in range(args.rounds):
            result["sdpa_ms"].append(median_ms(sdpa, qkv, H, dy, reps))
            result["fused_ms"].append(median_ms(cpu_attention.causal_attention, qkv, H, dy, reps))
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
