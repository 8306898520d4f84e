"""What the trainer costs on top of a bare PyTorch training loop of the same model and shape.

    python bench/overhead.py                    # medium preset, fp32, 3 rounds
    python bench/overhead.py --preset small --rounds 5

The bare loop is the least a training step can be: the same `GPT`, random token windows of the same
shape, forward, backward, gradient clipping, fused AdamW (as the trainer uses on CPU), nothing else. The
trainer is `python -m tinygpt.train` with its defaults (a metrics line every 10 steps, progress off),
timed from its own metrics (tokens/s over each 10-step interval, evaluation and checkpoints fall outside
them). Each round runs both, one after the other, in fresh processes with the same threads, so a busy
spell of the machine hits both; the figure is the median of the rounds' ratios (trainer / bare), with the
lowest and highest beside it. Prints one JSON line per round and a summary line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import PRESETS, ROOT, data_flags, flags_for
from tinygpt.training import metrics


def bare_loop(preset: str, steps: int, warmup: int) -> float:
    """Tokens/s of the bare loop (median of per-step times after warm-up), in this process."""
    import torch

    from tinygpt.base.config import ModelConfig
    from tinygpt.model import GPT

    c = PRESETS[preset]
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=c["n_layer"], n_head=c["n_head"], n_embd=c["n_embd"],
                            block_size=c["block_size"]), vocab_size=65)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, fused=True)
    shape = (c["batch_size"], c["block_size"])
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        x, y = torch.randint(0, 65, shape), torch.randint(0, 65, shape)
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return shape[0] * shape[1] / statistics.median(times[warmup:])


def trainer(preset: str, steps: int, warmup_intervals: int, threads: int | None) -> float:
    """Tokens/s of `python -m tinygpt.train` (median over its 10-step intervals after warm-up)."""
    with tempfile.TemporaryDirectory(prefix="tinygpt-overhead-") as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "tinygpt.train", *flags_for(PRESETS[preset]), *data_flags(),
               "--max-steps", str(steps), "--eval-interval", str(10 * steps), "--ckpt-interval", str(10 * steps),
               "--eval-windows", "16", "--sample-tokens", "0", "--out-dir", str(out), "--resume", "never",
               "--progress", "off", "--device", "cpu", "--precision", "fp32", "--data-dir", str(Path(tmp) / "data"),
               *(["--threads", str(threads)] if threads else [])]
        subprocess.run(cmd, check=True, capture_output=True, env=dict(os.environ, PYTHONPATH=str(ROOT),
                                                                         TINYGPT_OFFLINE="1"))
        records = metrics.read(metrics.of_run(out))
    speeds = [r["tokens_per_s"] for r in records if "tokens_per_s" in r and r["step"] < steps]
    return statistics.median(speeds[warmup_intervals:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="medium")
    parser.add_argument("--steps", type=int, default=60, help="steps per run (default 60)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, help="CPU threads for both (default: torch's choice)")
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)  # one bare run, in this process
    args = parser.parse_args()
    warmup = max(10, args.steps // 3)
    if args.bare:
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        print(bare_loop(args.preset, args.steps, warmup))
        return
    bare_cmd = [sys.executable, __file__, "--bare", "--preset", args.preset, "--steps", str(args.steps),
                *(["--threads", str(args.threads)] if args.threads else [])]
    bares, trainers = [], []
    for i in range(args.rounds):
        bare = float(subprocess.run(bare_cmd, check=True, capture_output=True, text=True).stdout)
        ours = trainer(args.preset, args.steps, warmup // 10, args.threads)
        bares.append(bare)
        trainers.append(ours)
        print(json.dumps({"round": i + 1, "bare_tokens_per_s": round(bare), "trainer_tokens_per_s": round(ours),
                          "ratio": round(ours / bare, 3)}), flush=True)
    ratios = [ours / bare for ours, bare in zip(trainers, bares)]
    print(json.dumps({"preset": args.preset, "config": PRESETS[args.preset], "steps": args.steps,
                      "rounds": args.rounds, "bare_tokens_per_s": round(statistics.median(bares)),
                      "trainer_tokens_per_s": round(statistics.median(trainers)),
                      "trainer_over_bare": round(statistics.median(ratios), 3),
                      "lowest_highest": [round(min(ratios), 3), round(max(ratios), 3)]}), flush=True)


if __name__ == "__main__":
    main()
