"""The trainer's tokens/s against a bare PyTorch loop of the same model, shape and optimizer, in one run.

    python bench/against_bare.py --preset medium --precision fp32            # 5 rounds, 100 steps each
    python bench/against_bare.py --preset smoke --precision fp32 --rounds 7
    python bench/against_bare.py --preset course-fast --precision bf16

The bare loop is the least a training step can be: random tokens of the batch's shape drawn on the spot (no
data to read, so the trainer's batches from the token file count against it), forward (under autocast for
bf16), backward, clipping, fused AdamW, and every 10 steps one `.item()` for a log line, as any loop that
logs. (nanoGPT's way of gathering windows, a Python loop of `torch.stack`, is slower than the trainer's
vectorised one: 0.89x and 0.93x of the trainer's speed in two rounds of the medium preset on a Zen 5, so it
would flatter the trainer.) The trainer is `python -m tinygpt.train` with its defaults (a metrics line every 10
steps, heartbeat, signals, schedule). Both are timed the same way: the wall time of each 10-step interval after
a warm-up, median over the intervals (evaluation and checkpoints fall outside them).

Rounds alternate the two in fresh processes (bare first in odd rounds, trainer first in even ones), so a busy
spell of a shared machine hits both. The figure is the best of the rounds for each (the least disturbed run
of each), and its ratio; the median of the per-round ratios is printed beside it. Prints this CPU, one JSON
line per round and a summary line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import PRESETS, cpu_line, data_flags, flags_for, trainer_env
from tinygpt.training import metrics

INTERVAL = 10  # steps per timed interval: the trainer's default log_interval


def interval_rate(ends: list[float], tokens_per_step: int, warmup_intervals: int) -> float:
    """Tokens/s: the median over the intervals between consecutive timestamps (one per INTERVAL steps)."""
    rates = [tokens_per_step * INTERVAL / (b - a) for a, b in zip(ends, ends[1:])][warmup_intervals:]
    return statistics.median(rates)


def bare(config: dict, steps: int, precision: str) -> list[float]:
    """Train the bare loop in this process; the time at the end of every INTERVAL-th step."""
    from contextlib import nullcontext

    import torch

    from tinygpt.base.config import ModelConfig
    from tinygpt.model import GPT

    vocab = 65  # (Tiny Shakespeare's)
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=config["n_layer"], n_head=config["n_head"], n_embd=config["n_embd"],
                            block_size=config["block_size"]), vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.get("lr", 1e-3), weight_decay=0.1, fused=True)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else nullcontext()
    B, T = config["batch_size"], config["block_size"]
    ends = [time.perf_counter()]
    for step in range(1, steps + 1):
        x, y = torch.randint(vocab, (B, T)), torch.randint(vocab, (B, T))
        with autocast:
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % INTERVAL == 0:
            loss.item()  # (the log line's)
            ends.append(time.perf_counter())
    return ends


def trainer(config: dict, steps: int, precision: str) -> list[float]:
    """Train `python -m tinygpt.train` with its default logging in a fresh process; its log lines' times."""
    with tempfile.TemporaryDirectory(prefix="tinygpt-bench-") as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "tinygpt.train", *flags_for(config), *data_flags(),
               "--max-steps", str(steps), "--log-interval", str(INTERVAL), "--eval-interval", str(10 * steps),
               "--ckpt-interval", str(10 * steps), "--eval-windows", "16", "--sample-tokens", "0",
               "--out-dir", str(out), "--resume", "never", "--progress", "off", "--device", "cpu",
               "--precision", precision, "--optimizer", "adamw", "--data-dir", str(Path(tmp) / "data")]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=trainer_env())
        if proc.returncode != 0:
            raise SystemExit(f"trainer failed:\n{proc.stdout}\n{proc.stderr}")
        records = metrics.read(metrics.of_run(out))
    return [0.0] + [r["elapsed_s"] for r in records if "lr" in r]  # (a step's line comes before any evaluation)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="medium")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--steps", type=int, default=100, help="steps per run (default 100)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)  # one bare run, in this process
    args = parser.parse_args()
    config = dict(PRESETS[args.preset])
    tokens_per_step = config["batch_size"] * config["block_size"]
    warmup = max(2, args.steps // INTERVAL // 3)  # intervals left out
    if args.bare:
        print(json.dumps(bare(config, args.steps, args.precision)))
        return
    print(json.dumps(cpu_line(True, None)), flush=True)
    bare_cmd = [sys.executable, __file__, "--bare", "--preset", args.preset, "--steps", str(args.steps),
                "--precision", args.precision]

    def run_bare() -> float:
        out = subprocess.run(bare_cmd, check=True, capture_output=True, text=True, env=trainer_env()).stdout
        return interval_rate(json.loads(out), tokens_per_step, warmup)

    def run_trainer() -> float:
        return interval_rate(trainer(config, args.steps, args.precision), tokens_per_step, warmup)

    bares, ours = [], []
    for i in range(args.rounds):
        order = (run_bare, run_trainer) if i % 2 == 0 else (run_trainer, run_bare)
        first, second = (f() for f in order)
        b, t = (first, second) if i % 2 == 0 else (second, first)
        bares.append(b)
        ours.append(t)
        print(json.dumps({"round": i + 1, "bare_tokens_per_s": round(b), "trainer_tokens_per_s": round(t),
                          "ratio": round(t / b, 3)}), flush=True)
    ratios = [t / b for t, b in zip(ours, bares)]
    print(json.dumps({"preset": args.preset, "precision": args.precision, "config": config, "steps": args.steps,
                      "rounds": args.rounds, "best_bare_tokens_per_s": round(max(bares)),
                      "best_trainer_tokens_per_s": round(max(ours)),
                      "trainer_over_bare": round(max(ours) / max(bares), 3),
                      "median_round_ratio": round(statistics.median(ratios), 3),
                      "lowest_highest": [round(min(ratios), 3), round(max(ratios), 3)]}), flush=True)


if __name__ == "__main__":
    main()
