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

import math  # noqa: E402 (the clock starts before anything is imported)

import bare_loop  # noqa: E402

RECIPE = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, lr=1e-3, min_lr=1e-4, max_steps=2000,
              warmup_steps=100, weight_decay=0.1, beta1=0.9, beta2=0.99, grad_clip=1.0, dropout=0.0, bias=False)


def lr_at(step: int, r: dict) -> float:
    """nanoGPT's get_lr: linear warm-up, cosine to min_lr at max_steps."""
    if step < r["warmup_steps"]:
        return r["lr"] * (step + 1) / (r["warmup_steps"] + 1)
    ratio = (step - r["warmup_steps"]) / (r["max_steps"] - r["warmup_steps"])
    return r["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (r["lr"] - r["min_lr"])


def main() -> None:
    import torch

    r = RECIPE
    args = bare_loop.parse(__doc__, r["max_steps"])
    data, model = bare_loop.data_and_model(r, args)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": r["weight_decay"]},
                                   {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                                  lr=r["lr"], betas=(r["beta1"], r["beta2"]))

    def set_lr(step: int) -> None:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, r)

    bare_loop.train_and_print(r, args, data, model, optimizer, PROCESS_START, before_step=set_lr)


if __name__ == "__main__":
    main()
