"""What the bare-loop yardsticks of bench/time_to_loss.py share (bench/nanogpt_loop.py, bench/course_loop.py):
their command line, their data and model (tinygpt's, so that a yardstick differs from ours in recipe and loop, not
in model), the loop that trains and scores, and the JSON object they print."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from common import SHAKESPEARE, full_split_val_loss, val_loss_on_windows


def parse(doc: str, steps: int) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--windows", type=int, default=2000)
    parser.add_argument("--max-steps", type=int, default=steps,
                        help=f"stop here (the schedule still spans the recipe's {steps:,} steps)")
    parser.add_argument("--data-dir", required=True)
    return parser.parse_args()


def data_and_model(recipe: dict, args: argparse.Namespace):
    """Tiny Shakespeare's windows at the recipe's context and batch, scored on `args.windows` fixed windows, and
    the recipe's model (seeded)."""
    import torch

    from tinygpt.base.config import ModelConfig
    from tinygpt.data import Batches, prepare_from_config
    from tinygpt.model import GPT

    torch.manual_seed(args.seed)
    prepared = prepare_from_config("shakespeare", str(SHAKESPEARE), args.data_dir)
    data = Batches(prepared, recipe["block_size"], recipe["batch_size"], seed=args.seed, eval_windows=args.windows)
    model = GPT(ModelConfig(n_layer=recipe["n_layer"], n_head=recipe["n_head"], n_embd=recipe["n_embd"],
                            block_size=recipe["block_size"], dropout=recipe["dropout"], bias=recipe["bias"]),
                prepared.vocab_size)
    return data, model


def train_and_print(recipe: dict, args: argparse.Namespace, data, model, optimizer, process_start: float,
                    before_step: Callable[[int], None] = lambda step: None,
                    after_step: Callable[[int], None] = lambda step: None) -> None:
    """Train `args.max_steps` steps (clipping at the recipe's grad_clip), scoring on the fixed windows every
    `args.eval_every` and at the end with the scoring's time kept out of the training time; then print the curve,
    the whole validation split's loss and the start-up time as one JSON object."""
    import torch

    points, train_s = [], 0.0
    clock = mark = time.perf_counter()
    for step in range(args.max_steps):
        before_step(step)
        x, y = data.next_train()
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe["grad_clip"])
        optimizer.step()
        after_step(step)
        done = step + 1
        if done % args.eval_every == 0 or done == args.max_steps:
            now = time.perf_counter()
            train_s += now - mark
            val = val_loss_on_windows(model, data)
            mark = time.perf_counter()
            points.append({"step": done, "val_loss": val, "train_s": train_s, "elapsed_s": mark - clock})
    print(json.dumps({
        "recipe": recipe, "seed": args.seed, "points": points,
        "tokens_per_step": recipe["batch_size"] * recipe["block_size"],
        "full_val_loss": full_split_val_loss(model, data), "startup_s": clock - process_start,
    }))
