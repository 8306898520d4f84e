"""A training program that is not TinyGPT's, as a user brings one: its own argparse, its own state, and the run
contract kept with three calls of the launcher's helper (docs/commands.md). It fits y = 3x + 0.5 by gradient
descent, in plain Python, so that it runs anywhere; yours would train a model.

    python launch.py hpc_lab/05_own_program/sweep.yaml --dry-run     # what would run
    python launch.py hpc_lab/05_own_program/sweep.yaml               # on a cluster (or the local one)
"""

import argparse
import time

from tinygpt import job

job.watch_stop()  # the stop signal (time limit near, preemption) is remembered, not fatal
parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, required=True)
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--step-s", type=float, default=0.0, help="seconds each step takes (to watch it run)")
args = parser.parse_args()

state = job.load("state.json") or {"step": 0, "w": 0.0, "b": 0.0}  # resumed, or fresh
points = [(x / 10, 3 * x / 10 + 0.5) for x in range(-10, 11)]
while state["step"] < args.steps:
    gw = sum(2 * (state["w"] * x + state["b"] - y) * x for x, y in points) / len(points)
    gb = sum(2 * (state["w"] * x + state["b"] - y) for x, y in points) / len(points)
    state = {"step": state["step"] + 1, "w": state["w"] - args.lr * gw, "b": state["b"] - args.lr * gb}
    loss = sum((state["w"] * x + state["b"] - y) ** 2 for x, y in points) / len(points)
    job.log(state["step"], loss=loss)  # metrics.jsonl: `status` shows the last step
    job.heartbeat()
    time.sleep(args.step_s)
    if job.stop_requested() and state["step"] < args.steps:
        job.save("state.json", state)
        job.requeue()  # exit 75: requeued, and resumed from state.json
job.save("state.json", state)
print(f"w={state['w']:.4f} b={state['b']:.4f} loss={loss:.6f} after {state['step']} steps")
