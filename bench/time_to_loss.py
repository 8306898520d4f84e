"""Time to a validation loss on Tiny Shakespeare, ours against a bare PyTorch loop, measured in one run.

    python bench/time_to_loss.py                                        # recipe cpu against nanogpt, 1 seed
    python bench/time_to_loss.py --recipe course-fast --yardstick course --seeds 3 --target 1.65
    python bench/time_to_loss.py --seeds 3 --recipe cpu-adamw cpu-muon  # three seeds each, alternated

For each seed in turn: our trainer (`python -m tinygpt.train`) on each recipe named, then the yardstick as a
bare PyTorch loop: nanoGPT's CPU recipe (bench/nanogpt_loop.py, context 64) or, with `--yardstick course`, the
course project page's (bench/course_loop.py, context 128). All are scored by one estimator: the mean loss on
`--windows` (2000) fixed, evenly spaced validation windows of the yardstick's context (tinygpt.data's: the
trainer's own evaluation, and the loop's, run on the same windows; so our recipes there have that context),
every `--eval-every` steps (default: a fortieth of the run), its time kept out of the training time and in
the wall time. A crossing of the target is placed by linear interpolation between the evaluations on either
side of it; the distance between those two, as a share of the crossing's step, is printed (`bracket`). A
run that never reaches a target counts its whole run, and the figures say they are a lower bound. At the
end: the loss over the whole validation split.

Prints a JSON line per run, then per contender the median (min to max) over the seeds of the training
seconds, wall seconds (from the process's start) and tokens to each target, with the ratios ours/yardstick
of the medians and of our slowest seed's training seconds to the yardstick's fastest.
Tokens to target do not depend on the machine; seconds do (compare runs of one invocation only). The first
line names the CPU and its bf16 matmul time against fp32's, and each of our runs the dtype Muon orthogonalised in
and why. `--onednn off` runs every contender with oneDNN off: the slow bf16 path of a CPU without fast bf16,
reproduced on one with it (bench/onednn_off).
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

from common import ROOT, SHAKESPEARE, cpu_line, flags_for, full_split_val_loss, trainer_env
from tinygpt.base.config import build
from tinygpt.training.metrics import crossing

HERE = Path(__file__).resolve().parent
KEYS = ("step", "train_s", "elapsed_s")  # of each evaluation: placed at the crossing by interpolation
# Our CPU recipes, at nanoGPT's context of 64 characters so that one estimator scores both (the search that
# chose them: jobs/recipe-search.yaml, docs/recipe-search.md).
RECIPES = {
    # The best trial of each search (jobs/recipe-search.yaml, jobs/recipe-search-muon.yaml; 16 trials each)
    "cpu-adamw": dict(n_layer=2, n_head=4, n_embd=64, block_size=64, batch_size=32, lr=4.16e-3, min_lr=1e-4,
                      warmup_steps=50, max_steps=1600),
    "cpu-muon": dict(n_layer=2, n_head=4, n_embd=96, block_size=64, batch_size=12, optimizer="muon",
                     muon_lr=0.02047, lr=4.146e-3, min_lr=1e-4, warmup_steps=25, max_steps=800),
    # nanoGPT's recipe run by our trainer: the loop's overhead against a bare one
    "nanogpt-cpu": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, lr=1e-3, min_lr=1e-4,
                        max_steps=2000, warmup_steps=100, weight_decay=0.1, beta2=0.99),
}

NOT_RECIPE_KEYS = ("dataset", "eval_interval", "eval_windows", "sample_tokens", "sample_prompt", "sample_temperature",
                   "sample_top_k", "log_interval", "ckpt_interval")


def spec_recipe(spec: str) -> dict:
    """The model and optimisation keys a spec in jobs/ trains with (not its data, evaluation or samples)."""
    import yaml

    train = yaml.safe_load((ROOT / "jobs" / spec).read_text())["train"]
    return {k: v for k, v in train.items() if k not in NOT_RECIPE_KEYS}


RECIPES["cpu"] = spec_recipe("smoke.yaml")  # the smoke run's recipe
RECIPES["course-fast"] = spec_recipe("course-fast.yaml")  # the course's quality soonest (docs/course-fast.md)
RECIPES["course-trainer"] = spec_recipe("sherlock.yaml")  # the course page's recipe, run by our trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", choices=sorted(RECIPES), nargs="+", default=["cpu"],
                        help="our recipes (each seed runs them all, in this order, then the yardstick)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="change our recipes")
    parser.add_argument("--target", type=float, nargs="+", default=[1.92, 1.886],
                        help="val losses to time (the first is the one the ratios are of)")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--windows", type=int, default=2000, help="evaluation windows (fixed, evenly spaced)")
    parser.add_argument("--eval-every", type=int, default=None, help="steps between evaluations")
    parser.add_argument("--yardstick", choices=sorted(LOOPS), default="nanogpt",
                        help="the bare loop ours are timed against (its context must be our recipes')")
    parser.add_argument("--no-yardstick", action="store_true", help="ours alone")
    parser.add_argument("--onednn", choices=("on", "off"), default="on",
                        help="off: bf16 matmuls take PyTorch's serial fallback (the slow bf16 path)")
    args = parser.parse_args()
    print(json.dumps(cpu_line(args.onednn == "on", None)), flush=True)
    if not SHAKESPEARE.exists():
        raise SystemExit(f"{SHAKESPEARE} is absent; this benchmark needs Tiny Shakespeare")
    recipes = {name: {**RECIPES[name], **dict(item.partition("=")[::2] for item in args.set)} for name in args.recipe}
    yardstick = [] if args.no_yardstick else [args.yardstick]
    for name, recipe in recipes.items():  # (one estimator: windows of the yardstick's context)
        context = build(recipe).model.block_size
        if yardstick and context != LOOPS[args.yardstick][2]:
            raise SystemExit(f"recipe {name} has context {context}, and the {args.yardstick} yardstick's windows are "
                             f"{LOOPS[args.yardstick][2]} characters; --set block_size={LOOPS[args.yardstick][2]}")
    results: dict[str, list[dict]] = {name: [] for name in [*recipes, *yardstick]}
    with tempfile.TemporaryDirectory(prefix="tinygpt-ttl-") as tmp:
        for seed in range(1, args.seeds + 1):
            for name in results:
                if name in LOOPS:
                    figures = loop(name, seed, args, Path(tmp))
                else:
                    figures = ours(recipes[name], seed, args, Path(tmp), Path(tmp) / f"{name}-{seed}")
                figures = {"contender": name, "seed": seed, **figures}
                figures["targets"] = {str(t): rounded(crossing(figures["points"], t, KEYS)) for t in args.target}
                results[name].append(figures)
                line = {k: v for k, v in figures.items() if k != "points"}  # (the curve is long; its end is kept)
                print(json.dumps({**line, "last": figures["points"][-1]}), flush=True)
    summarise(results, args.target, None if args.no_yardstick else args.yardstick)


def ours(recipe: dict, seed: int, args, tmp: Path, out: Path) -> dict:
    """Our trainer on `recipe`, in run directory `out`: its evaluations, as the points of the curve."""
    from tinygpt.data import Batches, prepare_from_config
    from tinygpt.training import checkpoint as ckpt
    from tinygpt.training import metrics
    from tinygpt.training.train_state import model_from

    steps = build(recipe).optim.max_steps  # (the trainer's default where the recipe does not say)
    every = args.eval_every or max(10, steps // 40)
    cmd = [sys.executable, "-m", "tinygpt.train", *flags_for(recipe), "--data-file", str(SHAKESPEARE),
           "--data-dir", str(tmp / "data"), "--out-dir", str(out), "--seed", str(seed), "--eval-interval", str(every),
           "--log-interval", str(every), "--ckpt-interval", str(steps), "--eval-windows", str(args.windows),
           "--sample-tokens", "0", "--progress", "off", "--resume", "never"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=trainer_env(args.onednn == "on"))
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"trainer failed:\n{proc.stderr}")
    records = metrics.read(metrics.of_run(out))
    start = next(r for r in records if r.get("event") == "start")
    finished = next(r for r in records if r.get("event") == "finished")
    points = [{k: r[k] for k in ("step", "val_loss", "train_s", "elapsed_s")} for r in records if "train_s" in r]
    model = model_from(ckpt.load_newest(out, warn=lambda m: print(m, file=sys.stderr)))
    data = Batches(prepare_from_config("shakespeare", str(SHAKESPEARE), str(tmp / "data")), model.cfg.block_size,
                   64, seed=0)
    return {"recipe": recipe, "points": points, "tokens_per_step": start["tokens_per_step"],
            "muon_precision": start.get("muon_precision"), "muon_precision_why": start.get("muon_precision_why"),
            "full_val_loss": round(full_split_val_loss(model, data), 4), "startup_s": wall - finished["elapsed_s"]}


LOOPS = {"nanogpt": ("nanogpt_loop.py", 2000, 64), "course": ("course_loop.py", 1500, 128)}  # script, steps, context


def loop(name: str, seed: int, args, tmp: Path) -> dict:
    script, steps, _ = LOOPS[name]
    every = args.eval_every or steps // 40
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(HERE / script), "--seed", str(seed), "--eval-every",
                           str(every), "--windows", str(args.windows), "--data-dir", str(tmp / "data")],
                          capture_output=True, text=True, env=trainer_env(args.onednn == "on"))
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"the {name} loop failed:\n{proc.stderr}")
    figures = json.loads(proc.stdout)  # (its startup_s is from the loop's first line: the interpreter's own
    figures["full_val_loss"] = round(figures["full_val_loss"], 4)  # start is ours alone)
    return {**figures, "process_wall_s": round(wall, 1)}


def rounded(found: dict | None) -> dict | None:
    return None if found is None else {k: round(v, 3) for k, v in found.items()}


def summarise(results: dict[str, list[dict]], targets: list[float], yardstick: str | None) -> None:
    def spread(values: list[float], form: str = ",.1f") -> str:
        return f"{statistics.median(values):{form}} ({min(values):{form}} to {max(values):{form}})"

    medians: dict[tuple[str, str, str], float] = {}
    ends: dict[tuple[str, str], tuple[float, float]] = {}  # (name, target) -> training seconds, fastest and slowest
    bounded: dict[tuple[str, str], bool] = {}  # (name, target) -> some run never reached it (a lower bound)
    for name, runs in results.items():
        if not runs:
            continue
        final = spread([r["points"][-1]["val_loss"] for r in runs], ".4f")
        print(f"\n{name}: {len(runs)} seed(s); final val on the windows {final}, whole split "
              f"{spread([r['full_val_loss'] for r in runs], '.4f')}")
        for t in map(str, targets):
            figures, short = to_target(runs, t)
            bound = f"; {short} never reached it: its whole run counted, a lower bound (>=)" if short else ""
            print(f"  to {t}: reached by {len(runs) - short} of {len(runs)}; "
                  + "; ".join(f"{k} {spread(v, ',.0f' if k == 'tokens' else ',.1f')}" for k, v in figures.items())
                  + bound)
            medians.update({(name, t, k): statistics.median(v) for k, v in figures.items()})
            ends[(name, t)] = (min(figures["train s"]), max(figures["train s"]))
            bounded[(name, t)] = short > 0
    for name in (n for n in results if yardstick and n != yardstick and results.get(yardstick)):
        for t in map(str, targets):
            ratios = [f"{k} {medians[(name, t, k)] / medians[(yardstick, t, k)]:.2f}" for k in ("train s", "wall s",
                                                                                               "tokens")]
            worst = ends[(name, t)][1] / ends[(yardstick, t)][0]
            # A lower bound over the yardstick makes the ratio an upper one, and one over ours a lower one.
            bound = {(False, False): "", (False, True): "at most ", (True, False): "at least ",
                     (True, True): "unknown (both are lower bounds): "}[(bounded[(name, t)], bounded[(yardstick, t)])]
            print(f"{name} / {yardstick} to {t} (medians): {bound}{', '.join(ratios)}; train s of {name}'s slowest "
                  f"seed / {yardstick}'s fastest: {bound}{worst:.2f}")


def to_target(runs: list[dict], target: str) -> tuple[dict[str, list[float]], int]:
    """Each run's training seconds, wall seconds and tokens to `target`; a run that never reached it counts its
    whole run (so a median over such runs is a lower bound), and how many did not."""
    figures: dict[str, list[float]] = {"train s": [], "wall s": [], "tokens": []}
    short = 0
    for r in runs:
        hit = r["targets"][target] or r["points"][-1]
        short += r["targets"][target] is None
        figures["train s"].append(hit["train_s"])
        figures["wall s"].append(hit["elapsed_s"] + r["startup_s"])
        figures["tokens"].append(hit["step"] * r["tokens_per_step"])
    return figures, short


if __name__ == "__main__":
    main()
