"""bf16 on this CPU, with oneDNN on and off in one run: a 512x512 matmul in bf16 and fp32; Muon's orthogonalisation
of one 512x128 update (five Newton-Schulz steps) as torch.optim.Muon runs it (bf16, one matrix at a time) and in
fp32; and for the smoke and course-fast models, one step's orthogonalisation as the trainer runs it (batched by
shape) in both dtypes, with the dtype the trainer's policy picks from that.

    python bench/bf16_paths.py [--repeats 5]

oneDNN off sends bf16 matmuls to PyTorch's serial fallback: the slow bf16 path of CPUs without fast bf16 (a Zen 2
EPYC: 512x512 in ~210 ms against 2.4 ms in fp32), reproduced on one with it. Prints one JSON line per setting:
the medians in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from common import ROOT  # noqa: F401 (puts the checkout on sys.path)


def median_ms(fn, repeats: int) -> float:
    fn()  # (warm-up)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(1000 * statistics.median(times), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import torch
    from torch.optim._muon import _zeropower_via_newtonschulz

    from tinygpt.base.config import ModelConfig, OptimConfig
    from tinygpt.training import bf16_probe
    from tinygpt.training.optimizers import muon_shapes, orthogonalise, torchs_iteration
    from tinygpt.training.precision import choose_policy

    g = torch.Generator().manual_seed(0)
    square, update = torch.randn(512, 512, generator=g), torch.randn(512, 128, generator=g)
    iteration = torchs_iteration()
    for onednn in (True, False):
        torch.backends.mkldnn.enabled = onednn
        bf16 = square.bfloat16()
        line = {"cpu": bf16_probe.cpu_model(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                "onednn": "on" if onednn else "off",
                "matmul_512_fp32_ms": median_ms(lambda: square @ square, args.repeats),
                "matmul_512_bf16_ms": median_ms(lambda b=bf16: b @ b, args.repeats),
                "torchs_newton_schulz_512x128_bf16_ms": median_ms(
                    lambda: _zeropower_via_newtonschulz(update, *iteration), args.repeats),
                "newton_schulz_512x128_fp32_ms": median_ms(
                    lambda: orthogonalise([update], *iteration, torch.float32), args.repeats)}
        for name, n_layer, n_embd in (("smoke", 2, 96), ("course-fast", 4, 128)):
            shapes = muon_shapes(ModelConfig(n_layer=n_layer, n_head=4, n_embd=n_embd), OptimConfig(optimizer="muon"))
            updates = [torch.randn(shape, generator=g) for shape in shapes]
            times = {name_: median_ms(lambda d=dtype, u=updates: orthogonalise(u, *iteration, d), args.repeats)
                     for name_, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32))}
            policy = choose_policy("cpu", None, muon=bf16_probe.describe(shapes),
                                   bf16_ratio=times["bf16"] / times["fp32"])
            line[f"{name}_step_orthogonalise_ms"] = times
            line[f"{name}_muon_in"] = policy.orthogonalise
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
