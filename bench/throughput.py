"""Training throughput of the real trainer on this machine, against a peak measured in the same run.

    python bench/throughput.py --preset small            # fp32 and bf16 (when the CPU has it)
    python bench/throughput.py --preset large --steps 6 --precision fp32
    python bench/throughput.py --preset large --dropout 0.2   # the published GPU recipe's dropout
    python bench/throughput.py --preset smoke --precision fp32 --optimizer both   # Muon's step against AdamW's
    python bench/throughput.py --preset smoke --precision fp32 --optimizer both --onednn off   # the slow bf16 path

First a line with this CPU, its bf16 matmul time against fp32 (the trainer's probe, bf16_probe.py) and oneDNN's
setting; then one JSON line per precision and optimizer: ms/iter (median after warm-up), tokens/s, MFU against the
best of several matmuls of the model's own shapes in that precision (measured here, before and after the run, with
the same threads), peak memory (resident set on CPU), precision, compile mode, and the dtype Muon orthogonalised
in, with the trainer's reason. `--onednn off` runs the trainer with oneDNN off, which sends bf16 matmuls to
PyTorch's serial fallback: a CPU whose bf16 matmul is slow, reproduced on one where it is fast.
"""

from __future__ import annotations

import argparse
import json
import time

from common import PRESETS, cpu_line, run_trainer


def measured_peak(config: dict, dtype_name: str, threads: int | None, seconds_per_shape: float = 1.0) -> float:
    """Best FLOP/s of the model's own matmul shapes (qkv, attention out, MLP in and out) in this dtype.

    Each shape runs for about `seconds_per_shape` in short timed chunks and the fastest chunk counts: on a
    shared machine a few long timings can all catch a busy moment and read the peak low, which would read
    the MFU high.
    """
    import torch

    if threads:
        torch.set_num_threads(threads)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    rows = config["batch_size"] * config["block_size"]
    c = config["n_embd"]
    best = 0.0
    for k, n in ((c, 3 * c), (c, c), (c, 4 * c), (4 * c, c)):
        a = torch.randn(rows, k, dtype=dtype)
        b = torch.randn(k, n, dtype=dtype)
        flops = 2 * rows * k * n
        for _ in range(2):
            a @ b  # warm-up
        t0 = time.perf_counter()
        a @ b
        reps = max(1, int(0.01 / max(time.perf_counter() - t0, 1e-6)))  # chunks of about 10 ms
        end = time.perf_counter() + seconds_per_shape
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            for _ in range(reps):
                a @ b
            best = max(best, flops * reps / (time.perf_counter() - t0))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="small")
    parser.add_argument("--precision", choices=("fp32", "bf16", "both"), default="both")
    parser.add_argument("--steps", type=int, help="default: 60 small, 30 medium, 6 large")
    parser.add_argument("--warmup", type=int, help="steps left out of the median (default: a third)")
    parser.add_argument("--compile", default="off")
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--threads", type=int, help="CPU threads (default: torch's choice)")
    parser.add_argument("--activation-checkpointing", action="store_true", help="recompute blocks in backward")
    parser.add_argument("--optimizer", choices=("adamw", "muon", "both"), default="adamw")
    parser.add_argument("--onednn", choices=("on", "off"), default="on",
                        help="off: bf16 matmuls take PyTorch's serial fallback (the slow bf16 path)")
    parser.add_argument("--loggers", default="none", help="trackers the trainer feeds, e.g. tensorboard,wandb "
                                                          "(W&B offline); default none")
    args = parser.parse_args()
    from tinygpt.base.config import ModelConfig
    from tinygpt.model import GPT
    from tinygpt.training.precision import cpu_has_bf16
    from tinygpt.training.speed import flops_per_token

    config = dict(PRESETS[args.preset])
    steps = args.steps or {"small": 60, "medium": 30, "large": 6, "cpu-fast": 45, "smoke": 60,
                           "course-fast": 45}[args.preset]
    print(json.dumps(cpu_line(args.onednn == "on", args.threads, config)), flush=True)
    warmup = args.warmup if args.warmup is not None else max(1, steps // 3)
    precisions = ["fp32", "bf16"] if args.precision == "both" else [args.precision]
    if "bf16" in precisions and not cpu_has_bf16():
        precisions.remove("bf16")
    model_cfg = {k: config[k] for k in ("n_layer", "n_head", "n_embd", "block_size")}
    n_params = GPT(ModelConfig(**model_cfg), vocab_size=65).num_params()
    fpt = flops_per_token(n_params, config["n_layer"], config["n_embd"], config["block_size"])
    extra = ["--compile", args.compile, "--dropout", str(args.dropout), "--device", "cpu",
             "--loggers", args.loggers, "--wandb-mode", "offline"]
    if args.threads:
        extra += ["--threads", str(args.threads)]
    if args.activation_checkpointing:
        extra += ["--activation-checkpointing"]
    optimizers = ["adamw", "muon"] if args.optimizer == "both" else [args.optimizer]
    for precision, optimizer in ((p, o) for p in precisions for o in optimizers):
        # The peak is measured before and after the run and the higher one counts: one measurement that
        # falls in a busy spell of a shared host reads the peak low and the MFU high. Both are printed; far
        # apart, they say the machine was busy.
        before = measured_peak(config, precision, args.threads)
        result = run_trainer(config, steps, warmup, [*extra, "--precision", precision, "--optimizer", optimizer],
                             onednn=args.onednn == "on")
        after = measured_peak(config, precision, args.threads)
        peak = max(before, after)
        result.update(preset=args.preset, optimizer=optimizer, onednn=args.onednn, config=config,
                      dropout=args.dropout, steps=steps, loggers=args.loggers,
                      activation_checkpointing=args.activation_checkpointing,
                      measured_peak_gflops=round(peak / 1e9, 1),
                      peak_gflops_before_after=[round(before / 1e9, 1), round(after / 1e9, 1)],
                      mfu=round(fpt * result["tokens_per_s"] / peak, 3))
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
