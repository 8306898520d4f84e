"""Time to a validation loss on Tiny Shakespeare, ours against nanoGPT's CPU recipe, measured in one run.

    python bench/time_to_loss.py                               # recipe cpu against nanogpt, 1 seed, val 1.92
    python bench/time_to_loss.py --seeds 3 --recipe cpu-adamw  # three seeds each, alternated

For each seed in turn: our trainer (`python -m tinygpt.train`, the recipe named), then nanoGPT's CPU recipe
as a bare PyTorch loop (bench/nanogpt_loop.py). Both are scored by one estimator: the mean loss on
`--windows` fixed, evenly spaced validation windows of 64 characters (tinygpt.data's: the trainer's own
evaluation, and the loop's, run on the same windows), every `--eval-every` steps (default: a fortieth of
the run), its time kept out of the training time and in the wall time. A crossing of the target is placed
by linear interpolation between the evaluations on either side of it; the distance between those two, as a
share of the crossing's step, is printed (`bracket`). At the end: the loss over the whole validation split.

Prints a JSON line per run, then per contender the median (min to max) over the seeds of the training
seconds, wall seconds (from the process's start) and tokens to each target, with the ratios ours/nanoGPT.
Tokens to target do not depend on the machine; seconds do (compare runs of one invocation only).
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

from common import ROOT, SHAKESPEARE, flags_for, full_split_val_loss
from tinygpt.metrics import crossing

HERE = Path(__file__).resolve().parent
KEYS = ("step", "train_s", "elapsed_s")  # of each evaluation: placed at the crossing by interpolation
# Our CPU recipes, at nanoGPT's context of 64 characters so that one estimator scores both (the search that
# chose them: jobs/recipe-search.yaml, docs/recipe-search.md).
RECIPES = {
    "cpu": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=16, lr=5e-3, min_lr=2e-4,
                warmup_steps=50, max_steps=1600),
    # nanoGPT's recipe run by our trainer: the loop's overhead against a bare one
    "nanogpt-cpu": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, lr=1e-3, min_lr=1e-4,
                        max_steps=2000, warmup_steps=100, weight_decay=0.1, beta2=0.99),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="cpu")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="change our recipe")
    parser.add_argument("--target", type=float, nargs="+", default=[1.92, 1.886],
                        help="val losses to time (the first is the one the ratios are of)")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--windows", type=int, default=250, help="evaluation windows (fixed, evenly spaced)")
    parser.add_argument("--eval-every", type=int, default=None, help="steps between evaluations")
    parser.add_argument("--no-nanogpt", action="store_true", help="ours alone")
    args = parser.parse_args()
    if not SHAKESPEARE.exists():
        raise SystemExit(f"{SHAKESPEARE} is absent; this benchmark needs Tiny Shakespeare")
    recipe = dict(RECIPES[args.recipe])
    for item in args.set:
        key, _, value = item.partition("=")
        recipe[key] = value
    results: dict[str, list[dict]] = {"ours": [], "nanogpt": []}
    with tempfile.TemporaryDirectory(prefix="tinygpt-ttl-") as tmp:
        for seed in range(1, args.seeds + 1):
            contenders = [("ours", lambda s=seed: ours(recipe, s, args, Path(tmp)))]
            if not args.no_nanogpt:
                contenders.append(("nanogpt", lambda s=seed: nanogpt(s, args, Path(tmp))))
            for name, run in contenders:
                figures = {"contender": name, "seed": seed, **run()}
                figures["targets"] = {str(t): rounded(crossing(figures["points"], t, KEYS)) for t in args.target}
                results[name].append(figures)
                print(json.dumps({k: v for k, v in figures.items() if k != "points"}), flush=True)
    summarise(results, args.target)


def ours(recipe: dict, seed: int, args, tmp: Path) -> dict:
    """Our trainer on `recipe`: its evaluations, as the points of the curve."""
    from tinygpt import checkpoint as ckpt
    from tinygpt import metrics
    from tinygpt.data import Batches, prepare_from_config
    from tinygpt.train_state import model_from

    steps = int(recipe.get("max_steps", 1600))
    every = args.eval_every or max(10, steps // 40)
    out = tmp / f"ours-{seed}"
    cmd = [sys.executable, "-m", "tinygpt.train", *flags_for(recipe), "--data-file", str(SHAKESPEARE),
           "--data-dir", str(tmp / "data"), "--out-dir", str(out), "--seed", str(seed), "--eval-interval", str(every),
           "--log-interval", str(every), "--ckpt-interval", str(steps), "--eval-windows", str(args.windows),
           "--sample-tokens", "0", "--progress", "off", "--resume", "never"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT),
                                                                        TINYGPT_OFFLINE="1"))
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"trainer failed:\n{proc.stderr}")
    records = metrics.read(out / "metrics.jsonl")
    start = next(r for r in records if r.get("event") == "start")
    finished = next(r for r in records if r.get("event") == "finished")
    points = [{k: r[k] for k in ("step", "val_loss", "train_s", "elapsed_s")} for r in records if "train_s" in r]
    model = model_from(ckpt.load_newest(out, warn=lambda m: print(m, file=sys.stderr)))
    data = Batches(prepare_from_config("shakespeare", str(SHAKESPEARE), str(tmp / "data")), model.cfg.block_size,
                   64, seed=0)
    return {"recipe": recipe, "points": points, "tokens_per_step": start["tokens_per_step"],
            "full_val_loss": round(full_split_val_loss(model, data), 4), "startup_s": wall - finished["elapsed_s"]}


def nanogpt(seed: int, args, tmp: Path) -> dict:
    every = args.eval_every or 2000 // 40
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(HERE / "nanogpt_loop.py"), "--seed", str(seed), "--eval-every",
                           str(every), "--windows", str(args.windows), "--data-dir", str(tmp / "data")],
                          capture_output=True, text=True, env=dict(os.environ, TINYGPT_OFFLINE="1"))
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"nanogpt loop failed:\n{proc.stderr}")
    figures = json.loads(proc.stdout)  # (its startup_s is from the loop's first line: the interpreter's own
    figures["full_val_loss"] = round(figures["full_val_loss"], 4)  # start is ours alone)
    return {**figures, "process_wall_s": round(wall, 1)}


def rounded(found: dict | None) -> dict | None:
    return None if found is None else {k: round(v, 3) for k, v in found.items()}


def summarise(results: dict[str, list[dict]], targets: list[float]) -> None:
    def spread(values: list[float]) -> str:
        if not values:
            return "not reached"
        return f"{statistics.median(values):,.1f} ({min(values):,.1f} to {max(values):,.1f})"

    medians: dict[tuple[str, str, str], float] = {}
    for name, runs in results.items():
        if not runs:
            continue
        final = spread([r["points"][-1]["val_loss"] for r in runs])
        print(f"\n{name}: {len(runs)} seed(s); final val on the windows {final}, whole split "
              f"{spread([r['full_val_loss'] for r in runs])}")
        for t in map(str, targets):
            hits = [r for r in runs if r["targets"][t]]
            figures = {"train s": [r["targets"][t]["train_s"] for r in hits],
                       "wall s": [r["targets"][t]["elapsed_s"] + r["startup_s"] for r in hits],
                       "tokens": [r["targets"][t]["step"] * r["tokens_per_step"] for r in hits]}
            print(f"  to {t}: reached by {len(hits)} of {len(runs)}; "
                  + "; ".join(f"{k} {spread(v)}" for k, v in figures.items()))
            for k, v in figures.items():
                if len(hits) == len(runs):
                    medians[(name, t, k)] = statistics.median(v)
    if results["nanogpt"]:
        for t in map(str, targets):
            both = [k for k in ("train s", "wall s", "tokens")
                    if ("ours", t, k) in medians and ("nanogpt", t, k) in medians]
            ratios = [f"{k} {medians[('ours', t, k)] / medians[('nanogpt', t, k)]:.2f}" for k in both]
            print(f"ours / nanogpt to {t}: {', '.join(ratios) or 'not reached by every seed of both'}")


if __name__ == "__main__":
    main()
