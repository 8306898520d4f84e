"""bf16 on this CPU, with oneDNN on and off in one run: a 512x512 matmul in bf16 and fp32, and Muon's
orthogonalisation of one 512x128 update (five Newton-Schulz steps) as torch.optim.Muon runs it (bf16) and as the
trainer runs it where bf16 is slow (fp32), with the dtype the trainer's policy picks for each setting.

    python bench/bf16_paths.py [--repeats 5]

oneDNN off sends bf16 matmuls to PyTorch's serial fallback: the slow bf16 path of CPUs without fast bf16 (a Zen 2
EPYC: 512x512 in ~210 ms against 2.4 ms in fp32), reproduced on one with it. Prints one JSON line per setting:
the medians in milliseconds, and the probe's ratio.
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
    from torch.optim._muon import DEFAULT_A, DEFAULT_B, DEFAULT_C

    from tinygpt.training import bf16_probe
    from tinygpt.training.optimizers import orthogonalise
    from tinygpt.training.precision import choose_policy

    g = torch.Generator().manual_seed(0)
    square, update = torch.randn(512, 512, generator=g), torch.randn(512, 128, generator=g)
    coefficients = (DEFAULT_A, DEFAULT_B, DEFAULT_C)
    for onednn in (True, False):
        torch.backends.mkldnn.enabled = onednn
        ratio = bf16_probe.measure()
        policy = choose_policy("cpu", None, muon=True, bf16_matmul_ratio=ratio)
        bf16 = square.bfloat16()
        print(json.dumps({
            "cpu": bf16_probe.cpu_model(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "onednn": "on" if onednn else "off",
            "matmul_512_fp32_ms": median_ms(lambda: square @ square, args.repeats),
            "matmul_512_bf16_ms": median_ms(lambda b=bf16: b @ b, args.repeats),
            "newton_schulz_512x128_bf16_ms": median_ms(
                lambda: orthogonalise(update, coefficients, 5, 1e-7, torch.bfloat16), args.repeats),
            "newton_schulz_512x128_fp32_ms": median_ms(
                lambda: orthogonalise(update, coefficients, 5, 1e-7, torch.float32), args.repeats),
            "probe_bf16_over_fp32": round(ratio, 2),
            "muon_orthogonalises_in": policy.orthogonalise, "why": policy.orthogonalise_why,
        }), flush=True)


if __name__ == "__main__":
    main()
