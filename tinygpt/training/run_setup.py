"""What a Trainer is built from, in the order it is built: the process placed (threads, device, precision, process
group), the checkpoint to resume from, the model's shape, the seeded batches / model / optimizer / grad scaler,
and what the loop calls (compiled, in DDP). Each step is a function of what it is given; the Trainer keeps the
order and gives back what was taken.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from tinygpt.base.config import ModelConfig, RunConfig, TrainConfig
from tinygpt.data import Batches, Prepared
from tinygpt.model import GPT
from tinygpt.training import checkpoint as ckpt
from tinygpt.training import distributed as dist_mod
from tinygpt.training import precision as precision_mod
from tinygpt.training import train_state
from tinygpt.training.optimizers import OptimizerMismatch, Optimizers
from tinygpt.training.speed import Meter, flops_per_token, peak_flops_for


class TrainingError(RuntimeError):
    """The run cannot go on (non-finite loss, bad checkpoint path, ...); shown without a traceback."""


def place(run: RunConfig, dist: dist_mod.DistEnv, out_dir: Path, muon: list[tuple[int, int]] | None = None
          ) -> tuple[str, precision_mod.Policy]:
    """Threads, device, precision policy (Muon's too, when the run trains with it) and the process group; rank 0
    makes the run directory."""
    threads = run.threads or int(os.environ.get("SLURM_CPUS_PER_TASK", "0") or 0)
    if threads:
        if threads > (cpus := len(os.sched_getaffinity(0))):
            print(f"warning: threads {threads} is more than the {cpus} CPU(s) this process may use: they share "
                  f"them, which is slower, not faster", file=sys.stderr)
        torch.set_num_threads(threads)
    device = precision_mod.pick_device(run.device, dist.local_rank)
    policy = precision_mod.resolve_policy(device, run.precision, run.compile, muon)
    precision_mod.apply(policy)
    dist_mod.init(dist, device, run.join_timeout, max(1800.0, 2 * run.hang_timeout))
    if policy.orthogonalise:  # every rank timed the probe itself: all step Muon as rank 0 does, or they drift apart
        policy = dist_mod.gather_objects(policy, dist)[0]
    if dist.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
    return device, policy


def find_resume(out_dir: Path, mode: str, parts: tuple[str, ...], is_main: bool,
                say: Callable[[str], None]) -> ckpt.Checkpoint | None:
    """The checkpoint `mode` (auto, never or a path) names, holding `parts`; None to start afresh."""
    if is_main:  # one process renames; the others wait, then all find the same newest checkpoint
        ckpt.set_aside_unusable(out_dir, parts, say)
    dist_mod.barrier()
    if mode == "never":
        return None
    try:
        if mode == "auto":
            return ckpt.load_newest(out_dir, lambda m: say(f"warning: {m}"), parts)
        path = Path(mode).expanduser()
        if not path.exists():
            raise TrainingError(f"resume: checkpoint {path} does not exist; give an existing file, auto or never")
        return ckpt.load(path, parts)
    except ckpt.CheckpointError as err:
        raise TrainingError(f"resume: {err}") from None


def model_config(wanted: ModelConfig, resume: ckpt.Checkpoint | None, vocab_size: int,
                 say: Callable[[str], None]) -> ModelConfig:
    """The model's shape: this run's, or on resume the checkpoint's (which wins, with a note)."""
    if resume is None:
        return wanted
    try:
        saved, saved_vocab = train_state.model_config(resume)
    except ckpt.CheckpointError as err:
        raise TrainingError(f"resume: {err}; resume from another checkpoint, or start anew with --resume "
                            f"never") from None
    if saved_vocab != vocab_size:
        raise TrainingError(
            f"the checkpoint has a vocabulary of {saved_vocab} characters, the data {vocab_size}: "
            f"it was trained on other data; use --resume never or another --out-dir"
        )
    differs = [f"{name}={getattr(saved, name)} (asked: {getattr(wanted, name)})"
               for name in type(saved).model_fields if getattr(saved, name) != getattr(wanted, name)]
    if differs:
        say("note: the checkpoint's model settings win over this run's: " + ", ".join(differs))
    return saved


def build(cfg: TrainConfig, prepared: Prepared, rank: int, device: str, policy: precision_mod.Policy
          ) -> tuple[Batches, GPT, Optimizers, torch.amp.GradScaler]:
    """Batches, model, optimizer and grad scaler, seeded: the same weights on every rank."""
    batches = Batches(prepared, cfg.model.block_size, cfg.data.batch_size, cfg.run.seed, rank, cfg.data.eval_windows)
    train_state.seed_everything(cfg.run.seed)
    model = GPT(cfg.model, prepared.vocab_size, cfg.run.activation_checkpointing).to(device)
    # Dropout noise differs per rank (the weights do not: DDP broadcasts rank 0's at start).
    train_state.seed_everything(cfg.run.seed + 1 + rank)
    try:
        optimizer = Optimizers(model, cfg.optim, policy.fused_adamw, policy.orthogonalise or "bf16")
    except OptimizerMismatch as err:
        raise TrainingError(str(err)) from None
    scaler = torch.amp.GradScaler(policy.device_type, enabled=policy.use_scaler)
    return batches, model, optimizer, scaler


def wrap(model: GPT, backend: str, dist: dist_mod.DistEnv, policy: precision_mod.Policy) -> torch.nn.Module:
    """What the loop calls: the model compiled, and across ranks in DDP (which keeps the weights in sync)."""
    compiled = torch.compile(model, backend=backend) if policy.compile else model
    if not dist.is_distributed:
        return compiled
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [torch.cuda.current_device()] if policy.device_type == "cuda" else None  # set by init
    return DDP(compiled, device_ids=ids)


def meter(cfg: TrainConfig, model: GPT, world: int, device: str, policy: precision_mod.Policy,
          start_step: int) -> Meter:
    """The speed meter of this run: its tokens per step, and MFU against the device's peak where it is known."""
    peak = cfg.run.peak_flops
    if peak is None and policy.device_type == "cuda":
        peak = peak_flops_for(torch.cuda.get_device_name(device))
    flops = flops_per_token(model.num_params(), cfg.model.n_layer, cfg.model.n_embd,
                                          cfg.model.block_size)
    return Meter(cfg.tokens_per_step(world), flops, peak, world, cfg.optim.max_steps, start_step)
