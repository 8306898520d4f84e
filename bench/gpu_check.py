"""A short check for a lent GPU machine: the 6x384, block-256, batch-64 config with the auto policy.

    python bench/gpu_check.py                 # 300 steps on CUDA; 4 steps on CPU (slow, but it keeps working)
    python bench/gpu_check.py --steps 100 --precision fp16 --compile off

Prints one JSON object: precision, compile on/off, ms/iter (median after warm-up), tokens/s, MFU
(against the GPU's peak from tinygpt.precision.PEAK_FLOPS) and peak memory.
"""

from __future__ import annotations

import argparse
import json
import platform

from common import PRESETS, run_trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, help="default: 300 on CUDA, 4 on CPU")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--compile", default="auto")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    import torch

    cuda = torch.cuda.is_available() and args.device != "cpu"
    steps = args.steps or (300 if cuda else 4)
    warmup = min(20, steps // 3) if cuda else 1
    result = run_trainer(PRESETS["large"], steps, warmup,
                         ["--precision", args.precision, "--compile", args.compile, "--device", args.device])
    result.update(config="large (6x384, block 256, batch 64)", steps=steps, torch=torch.__version__,
                  gpu=torch.cuda.get_device_name() if cuda else None, host=platform.node())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
