"""A plain PyTorch training script of someone else's: its own argparse and checkpoint, nothing of tinygpt-hpc
but the run contract kept by hand (the run's directory, the stop signal, exit 75 to be requeued, metrics.jsonl).
It fits a line to noisy points, one step every --step-s seconds, and writes its weights when it is done."""

import argparse
import json
import os
import signal
import time
from pathlib import Path

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, required=True)
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--step-s", type=float, default=0.0)
parser.add_argument("--out", required=True)
args = parser.parse_args()

stop = []
for name in {os.environ.get("TINYGPT_STOP_SIGNAL", "SIGUSR2"), "SIGTERM"}:
    signal.signal(getattr(signal, name), lambda signum, _: stop.append(signum))

out = Path(args.out)
torch.manual_seed(0)
x = torch.linspace(-1, 1, 64).unsqueeze(1)
y = 3 * x + 0.5 + 0.1 * torch.randn_like(x)
model = torch.nn.Linear(1, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
start = 0
if (out / "ckpt.pt").exists():
    saved = torch.load(out / "ckpt.pt")
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    start = saved["step"]
    print(f"resumed at step {start}", flush=True)
for step in range(start, args.steps):
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    with open(out / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": step + 1, "loss": loss.item()}) + "\n")
    time.sleep(args.step_s)
    if stop and step + 1 < args.steps:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1},
                   out / "ckpt.tmp")
        os.replace(out / "ckpt.tmp", out / "ckpt.pt")
        print(f"stopped by signal {stop[0]} at step {step + 1}; saved", flush=True)
        raise SystemExit(75)
(out / "weights.json").write_text(json.dumps([p.tolist() for p in model.parameters()]))
print("done", flush=True)
