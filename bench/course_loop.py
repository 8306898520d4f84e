"""The course project page's TinyGPT recipe as a bare PyTorch loop: a yardstick of bench/time_to_loss.py.

    python bench/course_loop.py --seed 1 --eval-every 50 --windows 2000 --data-dir DIR   # prints a JSON object

What the page has students train for about ten minutes on a laptop: 4 blocks, width 128, 4 heads, context 128,
dropout 0.1 (its `GPT(..., dropout=0.1)` default, which the recipe does not change), biases in every Linear and
LayerNorm, a GELU MLP of 4 x width, the output head tied to the token embedding, every weight drawn from
N(0, 0.02) and every bias zero; `AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)`, every parameter decayed;
`OneCycleLR(max_lr=3e-3, total_steps=1500, pct_start=0.1)` with PyTorch's defaults (cosine, div_factor 25,
final_div_factor 1e4, and beta1 cycled from 0.95 down to 0.85 and back); batches of 32 random windows; gradient
clipping at 1.0; the last 10% of the text held out (tinygpt.data's split). The model is tinygpt's GPT with the
page's initialisation put back (tinygpt's draws the residual projections narrower, as GPT-2 does).

Every `eval-every` steps (and at the end) it scores the model with the benchmark's estimator (the mean loss on
`windows` fixed, evenly spaced validation windows of the context's 128 characters: tinygpt.data's, the same the
trainer evaluates on), its time kept apart from training time; then the loss over the whole validation split.
"""

from __future__ import annotations

import time

PROCESS_START = time.perf_counter()

import bare_loop  # noqa: E402 (the clock starts before anything is imported)

RECIPE = dict(n_layer=4, n_head=4, n_embd=128, block_size=128, batch_size=32, lr=3e-3, weight_decay=0.01,
              max_steps=1500, warmup_share=0.1, grad_clip=1.0, dropout=0.1, bias=True)


def page_init(model) -> None:
    """The page's initialisation: every Linear and Embedding weight from N(0, 0.02), every bias zero (LayerNorm's
    weights stay one)."""
    import torch

    for module in model.modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, torch.nn.Linear) and module.bias is not None:
            torch.nn.init.zeros_(module.bias)


def main() -> None:
    import torch

    r = RECIPE
    args = bare_loop.parse(__doc__, r["max_steps"])
    data, model = bare_loop.data_and_model(r, args)
    page_init(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=r["lr"], weight_decay=r["weight_decay"])
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=r["lr"], total_steps=r["max_steps"],
                                                   pct_start=r["warmup_share"])
    bare_loop.train_and_print(r, args, data, model, optimizer, PROCESS_START, after_step=lambda step: schedule.step())


if __name__ == "__main__":
    main()
