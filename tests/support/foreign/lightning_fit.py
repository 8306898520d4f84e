"""A PyTorch Lightning script as people write one, knowing nothing of this project: argparse, a LightningModule, a
Trainer with a default_root_dir, its progress printed. Lightning's own Slurm logic is left as it comes: under Slurm
its SLURMEnvironment traps SIGUSR1, saves hpc_ckpt_N.ckpt in default_root_dir, runs `scontrol requeue` on the job
itself, and the next life's fit() starts from that checkpoint.

The test's knobs, for ends a real script meets: --fail-at N raises at step N (a bug); --hold-mb M holds M MB
from its first step, its first life until Slurm kills it (more than the job's --mem: out of memory); --hold-at N: a
first life (no checkpoint to start from) waits at step N until Slurm ends it, as a long step would (a test's time
to send the warning, on any machine)."""

import argparse
import time
from pathlib import Path

import pytorch_lightning as pl
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--max-steps", type=int, default=20)
parser.add_argument("--root", required=True)
parser.add_argument("--hold-at", type=int, default=-1)
parser.add_argument("--fail-at", type=int, default=-1)
parser.add_argument("--hold-mb", type=int, default=0)
args = parser.parse_args()


def hold_until_killed(root: Path, mb: int) -> torch.Tensor:
    """`mb` MB, touched; a first life (no mark in `root`, made before the memory: Slurm may kill it while it fills)
    waits with them for Slurm to kill it; a later one goes on."""
    mark = root / "held-once"
    first = not mark.exists()
    root.mkdir(parents=True, exist_ok=True)
    mark.touch()
    held = torch.ones(mb * 2**18)  # (4 bytes each)
    if first:
        time.sleep(600)
    return held


class Line(pl.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.net = torch.nn.Linear(4, 1)
        self.held = None

    def training_step(self, batch, _):
        if self.global_step == args.fail_at:
            raise ValueError(f"bad batch at step {self.global_step}: labels out of range")
        if args.hold_mb and self.held is None:
            self.held = hold_until_killed(Path(args.root), args.hold_mb)
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        print(f"step {self.global_step}: train_loss {loss.item():.4f}", flush=True)
        held_since = time.monotonic()
        while self.global_step == args.hold_at and self.trainer.ckpt_path is None and \
                not self.trainer.received_sigterm and time.monotonic() - held_since < 600:
            time.sleep(0.05)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


generator = torch.Generator().manual_seed(0)
x = torch.randn(64, 4, generator=generator)
data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True, generator=generator)
pl.seed_everything(0, verbose=False)
trainer = pl.Trainer(max_steps=args.max_steps, default_root_dir=args.root, accelerator="cpu", devices=1,
                     logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Line(args.lr), loader)
print(f"done at step {trainer.global_step}")
