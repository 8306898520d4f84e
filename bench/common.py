"""Shared by the benchmarks: run the real trainer in a fresh process and read its figures back.

Benchmarks time `python -m tinygpt.train` itself (no second copy of the training step), with one
metrics line per step, and report the median step time after a warm-up.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/x.py` from anywhere, installed or not
    sys.path.insert(0, str(ROOT))
from tinygpt.training import metrics  # noqa: E402 (importable from the line above)

SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"

PRESETS = {
    "small": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12),
    "medium": dict(n_layer=4, n_head=4, n_embd=128, block_size=128, batch_size=32),
    "large": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=64),
    "cpu-fast": dict(n_layer=4, n_head=4, n_embd=128, block_size=128, batch_size=16),  # the CPU recipe's shape
    # The recipes' models and rates (jobs/smoke.yaml, jobs/course-fast.yaml): --optimizer muon trains them as those do
    "smoke": dict(n_layer=2, n_head=4, n_embd=96, block_size=64, batch_size=12, lr=4.1e-3, muon_lr=0.0205),
    "course-fast": dict(n_layer=4, n_head=4, n_embd=128, block_size=128, batch_size=16, lr=4.6e-3, muon_lr=0.0247),
}
ONEDNN_OFF = ROOT / "bench" / "onednn_off"  # a sitecustomize that turns oneDNN off (the slow bf16 path)


def flags_for(config: dict) -> list[str]:
    out = []
    for key, value in config.items():
        out += [f"--{key.replace('_', '-')}", str(value)]
    return out


def data_flags() -> list[str]:
    """Tiny Shakespeare when it is beside the repository, else the built-in corpus (speed is the same)."""
    return ["--data-file", str(SHAKESPEARE)] if SHAKESPEARE.exists() else ["--dataset", "pydoc"]


def trainer_env(onednn: bool = True) -> dict[str, str]:
    """The environment a benchmark's trainer (or bare loop) runs in: this checkout, offline, oneDNN on or off."""
    path = str(ROOT) if onednn else os.pathsep.join([str(ONEDNN_OFF), str(ROOT)])
    return dict(os.environ, PYTHONPATH=path, TINYGPT_OFFLINE="1")


def cpu_line(onednn: bool, threads: int | None, config: dict | None = None) -> dict:
    """This CPU: a 512x512 matmul's time in bf16 over fp32, and (given a model `config`) the trainer's probe, the
    time of orthogonalising that model's Muon matrices in bf16 over fp32 (measured now, not read from its cache)."""
    import torch

    from tinygpt.base.config import ModelConfig, OptimConfig
    from tinygpt.training import bf16_probe
    from tinygpt.training.optimizers import muon_shapes

    if threads:
        torch.set_num_threads(threads)
    torch.backends.mkldnn.enabled = onednn

    square, bf16 = torch.randn(512, 512), torch.randn(512, 512).bfloat16()
    line = {"cpu": bf16_probe.cpu_model(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "onednn": "on" if onednn else "off", "mkldnn_bf16_supported": torch.ops.mkldnn._is_mkldnn_bf16_supported(),
            "matmul_512_bf16_over_fp32": round(bf16_probe.best_seconds(lambda: bf16 @ bf16)
                                               / bf16_probe.best_seconds(lambda: square @ square), 2)}
    if config:
        shapes = muon_shapes(ModelConfig(n_layer=config["n_layer"], n_head=config["n_head"], n_embd=config["n_embd"]),
                             OptimConfig(optimizer="muon"))
        line["muon_work"] = bf16_probe.describe(shapes)
        line["muon_bf16_over_fp32"] = round(bf16_probe.measure(shapes), 2)
    return line


def run_trainer(config: dict, steps: int, warmup: int, extra: list[str] | None = None, onednn: bool = True) -> dict:
    """Train `steps` steps in a subprocess (oneDNN off in it when `onednn` is False); return timing, memory and
    policy figures."""
    with tempfile.TemporaryDirectory(prefix="tinygpt-bench-") as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "tinygpt.train", *flags_for(config), *data_flags(),
               "--max-steps", str(steps), "--log-interval", "1", "--eval-interval", str(10 * steps),
               "--ckpt-interval", str(10 * steps), "--eval-windows", "16", "--sample-tokens", "0",
               "--warmup-steps", "10", "--out-dir", str(out), "--resume", "never", "--progress", "off",
               "--data-dir", str(Path(tmp) / "data"), *(extra or [])]
        env = trainer_env(onednn)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"trainer failed:\n{proc.stdout}\n{proc.stderr}")
        records = metrics.read(metrics.of_run(out))
    start = next(r for r in records if r.get("event") == "start")
    finished = next(r for r in records if r.get("event") == "finished")
    steps_timed = [r for r in records if "lr" in r]
    times = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(steps_timed, steps_timed[1:])][warmup:]
    ms = 1000 * statistics.median(times)
    tokens_per_step = start["tokens_per_step"]
    result = {
        "precision": start["precision"],
        "muon_precision": start.get("muon_precision"),  # (and why: the bf16 probe's figure)
        "muon_precision_why": start.get("muon_precision_why"),
        "compile": start["compile"],
        "device": start["device"],
        "steps_timed": len(times),
        "ms_per_iter": round(ms, 2),
        "tokens_per_s": round(tokens_per_step / (ms / 1000)),
        "peak_memory_mb": round(finished["peak_memory_mb"], 1),
        "final_train_loss": round(steps_timed[-1]["train_loss"], 4),
    }
    mfus = [r["mfu"] for r in steps_timed[warmup + 1:] if "mfu" in r]
    if mfus:
        result["mfu"] = round(statistics.median(mfus), 4)
    return result


def trial_options(doc: str, cases: tuple[str, ...] = ()):
    """The options of the fault trials (bench/*_trials.py): how many of each case, the seed of the moments
    drawn, and (given `cases`) which cases to try; (the options, a random.Random of that seed)."""
    import argparse
    import random

    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=3, help="trials of each case (default 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the moments drawn (default 0)")
    if cases:
        p.add_argument("--cases", default=",".join(cases),
                       help=f"comma-separated, of {', '.join(cases)} (default: all)")
    args = p.parse_args()
    if cases:
        args.cases = [c for c in args.cases.split(",") if c]
        if not args.cases or set(args.cases) - set(cases):
            p.error(f"--cases: choose among {', '.join(cases)}")
    return args, random.Random(args.seed)


def val_loss_on_windows(model, batches) -> float:
    """The mean loss on the validation split's fixed, evenly spaced windows (tinygpt.data.Batches): what the
    trainer's evaluation reports as val_loss, by the trainer's own arithmetic (fp32 on the CPU)."""
    from contextlib import nullcontext

    import torch

    from tinygpt.training.trainer import window_loss_sums

    was_training = model.training
    model.eval()
    with torch.no_grad():
        total, count = window_loss_sums(model, batches, "val", "cpu", nullcontext)
    model.train(was_training)
    return total / count


def full_split_val_loss(model, batches) -> float:
    """The mean loss over every non-overlapping window of the validation split: what the windows estimate."""
    import torch

    was_training = model.training
    model.eval()
    T = batches.block_size
    offsets = torch.arange(0, len(batches.val) - T - 1, T)
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(offsets), 256):
            x, y = batches.windows("val", offsets[i:i + 256])
            total += model(x, y)[1].item() * len(x)
    model.train(was_training)
    return total / len(offsets)
