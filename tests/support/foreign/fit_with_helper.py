"""fit.py's training, keeping the run contract with the launcher's helper (`from tinygpt import job`), which the
job finds on its path without anything installed."""

import argparse
import json
import time

from tinygpt import job

job.watch_stop()
parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, required=True)
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--step-s", type=float, default=0.0)
args = parser.parse_args()

state = job.load("state.json") or {"step": 0, "w": 0.0, "b": 0.0}
xs = [i / 10 for i in range(-10, 11)]
while state["step"] < args.steps:
    # plain gradient descent on y = 3x + 0.5, in floats: the same every time it is run
    gw = sum(2 * (state["w"] * x + state["b"] - (3 * x + 0.5)) * x for x in xs) / len(xs)
    gb = sum(2 * (state["w"] * x + state["b"] - (3 * x + 0.5)) for x in xs) / len(xs)
    state = {"step": state["step"] + 1, "w": state["w"] - args.lr * gw, "b": state["b"] - args.lr * gb}
    job.log(state["step"], w=state["w"])
    job.heartbeat()
    time.sleep(args.step_s)
    if job.stop_requested() and state["step"] < args.steps:
        job.save("state.json", state)
        job.requeue()
job.save("weights.json", state)
print(json.dumps(state))
