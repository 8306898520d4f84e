"""A DDP training script of someone else's, meant for torchrun: plain torch.distributed from the environment torchrun
gives, its own argparse and checkpoint, and the run contract kept by hand (the stop signal, exit 75 to be requeued,
metrics.jsonl). Every rank fits a line to its share of noisy points, one step every --step-s seconds; the ranks
agree each step on whether any of them was asked to stop, so that all save the same step (rank 0 writes it)."""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, required=True)
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--step-s", type=float, default=0.0)
parser.add_argument("--out", required=True)
args = parser.parse_args()

stop = []
for name in {os.environ.get("TINYGPT_STOP_SIGNAL", "SIGUSR2"), "SIGTERM"}:
    signal.signal(getattr(signal, name), lambda signum, _: stop.append(signum))

def leave(code: int) -> None:
    """The end of the process, past the interpreter's teardown: torch 2.13's c10d may abort there ("terminate
    called without an active exception", status 134) once the store it talked to has gone, seen under torchrun
    now and then, whatever the program did before."""
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
out = Path(args.out)
torch.manual_seed(0)
x = torch.linspace(-1, 1, 64).unsqueeze(1)
y = 3 * x + 0.5 + 0.1 * torch.randn_like(x)
mine = slice(rank, None, world)
model = DistributedDataParallel(torch.nn.Linear(1, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
start = 0
if (out / "ckpt.pt").exists():
    saved = torch.load(out / "ckpt.pt")
    model.module.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    start = saved["step"]
    print(f"rank {rank} of {world} resumed at step {start}", flush=True)
for step in range(start, args.steps):
    loss = torch.nn.functional.mse_loss(model(x[mine]), y[mine])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if rank == 0:
        with open(out / "metrics.jsonl", "a") as fh:
            fh.write(json.dumps({"step": step + 1, "loss": loss.item(), "world": world}) + "\n")
    time.sleep(args.step_s)
    asked = torch.tensor([float(bool(stop))])
    dist.all_reduce(asked, op=dist.ReduceOp.MAX)
    if asked.item() and step + 1 < args.steps:
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1},
                       out / "ckpt.tmp")
            os.replace(out / "ckpt.tmp", out / "ckpt.pt")
            print(f"stopped at step {step + 1}; saved", flush=True)
        dist.barrier()
        leave(75)
if rank == 0:
    (out / "weights.json").write_text(json.dumps([p.tolist() for p in model.module.parameters()]))
    print("done", flush=True)
dist.barrier()
leave(0)
