"""nanoGPT's CPU recipe for Tiny Shakespeare as a bare PyTorch loop: the yardstick of bench/time_to_loss.py.

    python bench/nanogpt_loop.py --seed 1 --eval-every 50 --windows 2000 --data-dir DIR   # prints a JSON object

What nanoGPT's README runs on a CPU (`config/train_shakespeare_char.py --device=cpu --compile=False
--block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000
--dropout=0.0`): AdamW (lr 1e-3, betas 0.9/0.99, weight decay 0.1 on matrices), 100 warm-up steps, cosine
decay to 1e-4 over 2000 steps, gradient clipping at 1.0, random windows of the training split, fp32, no bias.
The loop is nanoGPT's, written again in a page; the model is tinygpt's GPT, whose architecture and
initialisation are nanoGPT's (so the yardstick differs from ours in recipe and loop, not in model).

Every `eval-every` steps (and at the end) it scores the model with the benchmark's estimator (the mean loss
on `windows` fixed, evenly spaced validation windows: tinygpt.data's, the same that the trainer evaluates
on), its time kept apart from training time; then the loss over the whole validation split.
"""

from __future__ import annotations

import time

PROCESS_START = time.perf_counter()

import argparse  # noqa: E402 (the clock starts before anything is imported)
import json  # noqa: E402
import math  # noqa: E402

from common import SHAKESPEARE, full_split_val_loss, val_loss_on_windows  # noqa: E402

RECIPE = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, lr=1e-3, min_lr=1e-4, max_steps=2000,
              warmup_steps=100, weight_decay=0.1, beta1=0.9, beta2=0.99, grad_clip=1.0, dropout=0.0, bias=False)


def lr_at(step: int, r: dict) -> float:
    """nanoGPT's get_lr: linear warm-up, cosine to min_lr at max_steps."""
    if step < r["warmup_steps"]:
        return r["lr"] * (step + 1) / (r["warmup_steps"] + 1)
    ratio = (step - r["warmup_steps"]) / (r["max_steps"] - r["warmup_steps"])
    return r["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (r["lr"] - r["min_lr"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--windows", type=int, default=2000)
    parser.add_argument("--data-dir", required=True)
    args = parser.parse_args()

    import torch

    from tinygpt.config import ModelConfig
    from tinygpt.data import Batches, prepare_from_config
    from tinygpt.model import GPT

    r = RECIPE
    torch.manual_seed(args.seed)
    prepared = prepare_from_config("shakespeare", str(SHAKESPEARE), args.data_dir)
    data = Batches(prepared, r["block_size"], r["batch_size"], seed=args.seed, eval_windows=args.windows)
    model = GPT(ModelConfig(n_layer=r["n_layer"], n_head=r["n_head"], n_embd=r["n_embd"],
                            block_size=r["block_size"], dropout=r["dropout"], bias=r["bias"]), prepared.vocab_size)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": r["weight_decay"]},
                                   {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                                  lr=r["lr"], betas=(r["beta1"], r["beta2"]))
    points, train_s, eval_s = [], 0.0, 0.0
    clock = time.perf_counter()
    mark = clock
    for step in range(r["max_steps"]):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, r)
        x, y = data.next_train()
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), r["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        done = step + 1
        if done % args.eval_every == 0 or done == r["max_steps"]:
            now = time.perf_counter()
            train_s += now - mark
            val = val_loss_on_windows(model, data)
            mark = time.perf_counter()
            eval_s += mark - now
            points.append({"step": done, "val_loss": val, "train_s": train_s, "elapsed_s": mark - clock})
    print(json.dumps({
        "recipe": r, "seed": args.seed, "points": points, "tokens_per_step": r["batch_size"] * r["block_size"],
        "full_val_loss": full_split_val_loss(model, data), "startup_s": clock - PROCESS_START,
    }))


if __name__ == "__main__":
    main()
