"""`python -m tinygpt.train`: the one entry point for every way of training.

    python -m tinygpt.train --n-layer 2 --max-steps 100               # one CPU process
    torchrun --nproc-per-node 4 -m tinygpt.train --config run.yaml     # DDP from torchrun's env
    srun python -m tinygpt.train --n-layer 6 --n-embd 384              # DDP from Slurm's env

A step is one optimizer update; `step` in metrics and checkpoints counts completed updates. The loop:

    for each step: lr from the schedule -> grad_accum micro-batches (gradients synchronised on the last
    one only) -> clip -> optimizer step -> log every log_interval -> evaluate every eval_interval ->
    checkpoint every ckpt_interval -> a stop request (signal, stop_after) ends the loop after a save.
"""

from __future__ import annotations

if __name__ == "__main__":
    # Slurm's warning can arrive before torch has even been imported (a requeued job with little time
    # left, a loaded node): from the first instant, record it instead of dying of the default action.
    # The preemption handler picks up what was recorded, and these stay as the fallback afterwards.
    from tinygpt import preemption as _early

    _early.install_early_recorder()

import hashlib
import json
import math
import os
import random
import socket
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from . import checkpoint as ckpt
from . import config as config_mod
from . import cpu_allocator, cpu_kernels, provenance
from . import distributed as dist_mod
from . import precision as precision_mod
from . import preemption as preempt_mod
from . import progress as progress_mod
from .config import ConfigError, TrainConfig
from .data import Batches, DataError, prepare_from_config
from .model import GPT, GPTConfig

MODEL_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "dropout", "bias", "pos_emb")


class TrainingError(RuntimeError):
    """The run cannot go on (non-finite loss, bad checkpoint path, ...); shown without a traceback."""


@dataclass
class TrainResult:
    out_dir: Path
    step: int
    finished: bool
    best_val_loss: float | None
    last_val_loss: float | None
    exit_code: int = 0
    sample: str | None = None


def lr_at(step: int, cfg: config_mod.OptimConfig) -> float:
    """Linear warm-up, then cosine decay from lr to min_lr over lr_decay_steps (step is 0-based)."""
    decay_steps = cfg.lr_decay_steps or cfg.max_steps
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / (cfg.warmup_steps + 1)
    if step >= decay_steps:
        return cfg.min_lr
    ratio = (step - cfg.warmup_steps) / max(1, decay_steps - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.lr - cfg.min_lr)


def make_optimizer(model: GPT, cfg: config_mod.OptimConfig, fused: bool) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only: biases, LayerNorm gains and... nothing else decays."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused or None)


class MetricsLog:
    """`metrics.jsonl`, one JSON object per line, every line with `step`. Rank 0 only."""

    def __init__(self, path: Path, enabled: bool):
        self.path = path
        self.enabled = enabled

    def truncate_after(self, step: int) -> None:
        """Drop lines past `step`: a run that died after its last checkpoint logged steps it will redo."""
        if not self.enabled:
            return
        if step == 0:
            self.path.unlink(missing_ok=True)
            return
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                if json.loads(line).get("step", 0) <= step:
                    kept.append(line)
            except ValueError:
                continue  # a half-written last line from a killed process
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, self.path)

    def write(self, record: dict) -> None:
        if self.enabled:
            with open(self.path, "a") as fh:
                fh.write(json.dumps(record) + "\n")


def _set_threads(cfg: TrainConfig) -> None:
    threads = cfg.run.threads or int(os.environ.get("SLURM_CPUS_PER_TASK", "0") or 0)
    if threads:
        torch.set_num_threads(threads)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@torch.no_grad()
def evaluate(model, batches: Batches, policy, device: str, dist_env) -> dict[str, float]:
    """Mean loss over the fixed windows of each split; windows are shared out across ranks."""
    was_training = model.training
    model.eval()
    out = {}
    for split in ("train", "val"):
        total, count = 0.0, 0
        for i, (x, y) in enumerate(batches.eval_batches(split)):
            if i % dist_env.world_size != dist_env.rank:
                continue
            x, y = x.to(device), y.to(device)
            with policy.autocast():
                _, loss = model(x, y)
            total += loss.item() * x.size(0)
            count += x.size(0)
        if dist_env.is_distributed:
            t = torch.tensor([total, count], dtype=torch.float64, device=device)
            torch.distributed.all_reduce(t)
            total, count = float(t[0]), int(t[1])
        out[split] = total / count
    model.train(was_training)
    return out


def sample_text(model: GPT, prepared, prompt: str, tokens: int, seed: int, device: str,
                temperature: float = 0.8, top_k: int | None = 20) -> str:
    vocab = set(prepared.vocab)
    prompt = "".join(ch for ch in prompt if ch in vocab) or prepared.vocab[0]
    ids = torch.tensor([prepared.encode(prompt)], dtype=torch.long, device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    was_training = model.training
    model.eval()
    out = model.generate(ids, tokens, temperature=temperature, top_k=top_k, generator=generator)
    model.train(was_training)
    return prepared.decode(out[0].tolist())


def peak_memory_mb(device: str) -> float:
    """Peak memory of this process: allocated GPU memory on CUDA, resident set size on CPU."""
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def weights_digest(model: torch.nn.Module) -> str:
    """A short hash of every parameter's bytes: equal on all ranks when DDP kept them in sync."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def _model_config(cfg: TrainConfig, vocab_size: int, saved: dict | None, say) -> GPTConfig:
    wanted = {k: getattr(cfg.model, k) for k in MODEL_KEYS}
    if saved is None:
        return GPTConfig(vocab_size=vocab_size, **wanted)
    differs = [f"{k}={saved[k]} (asked: {wanted[k]})" for k in MODEL_KEYS if saved.get(k) != wanted[k]]
    if differs:
        say("note: the checkpoint's model settings win over this run's: " + ", ".join(differs))
    if saved["vocab_size"] != vocab_size:
        raise TrainingError(
            f"the checkpoint has a vocabulary of {saved['vocab_size']} characters, the data {vocab_size}: "
            f"it was trained on other data; use --resume never or another --out-dir"
        )
    return GPTConfig(**saved)


def _choose_cpu_kernels(mode: str, device: str, gpt_cfg: GPTConfig, precision: str, say) -> list[str]:
    """Which of tinygpt/cpu_kernels.py's kernels this run uses (building them if need be): none on CUDA,
    with `--cpu-kernels off` or after a failed build; otherwise those that this model's shapes and the
    precision let run (GELU's input is bf16 under bf16 autocast). Training with attention dropout uses
    tinygpt/kernels.py for attention; evaluation then uses the kernel."""
    cpu_kernels.deactivate()
    if device != "cpu" or mode == "off":
        return []
    try:
        if not cpu_kernels.activate(mode, say):
            return []
    except cpu_kernels.CpuKernelsError as err:
        raise TrainingError(str(err)) from None
    used = [k for k in cpu_kernels.KERNELS
            if cpu_kernels.unsupported(k, gpt_cfg.n_embd, gpt_cfg.n_head, gpt_cfg.block_size) is None]
    return [k for k in used if not (k == "gelu" and precision != "fp32")]


def _choose_cpu_allocator(mode: str, device: str, say) -> str | None:
    """Where CPU tensors get their memory (tinygpt/cpu_allocator.py): "caching" or "malloc"; None on CUDA."""
    if device != "cpu":
        return None
    try:
        return cpu_allocator.install(mode, say)
    except cpu_allocator.CpuAllocatorError as err:
        raise TrainingError(str(err)) from None


def _find_resume(cfg: TrainConfig, out_dir: Path, say):
    mode = cfg.run.resume
    if mode == "never":
        return None, None
    if mode == "auto":
        return ckpt.load_newest(out_dir, warn=lambda m: say(f"warning: {m}"))
    path = Path(mode).expanduser()
    if not path.exists():
        raise TrainingError(f"resume: checkpoint {path} does not exist; give an existing file, auto or never")
    try:
        return path, ckpt.load(path)
    except ckpt.CheckpointError as err:
        raise TrainingError(f"resume: {err}") from None


def train(cfg: TrainConfig, requeue_hook=None) -> TrainResult:
    """Train (or continue) the run `cfg` describes.

    requeue_hook: called on rank 0, after the checkpoint is saved, instead of `scontrol requeue` when a
    preemption signal asks for a requeue (the submitit backend hands over to submitit's handler here).
    """
    dist_env = dist_mod.detect()
    _set_threads(cfg)
    device = precision_mod.pick_device(cfg.run.device, dist_env.local_rank)
    policy = precision_mod.resolve_policy(device, cfg.run.precision, cfg.run.compile,
                                          cfg.data.batch_size * cfg.model.block_size)
    precision_mod.apply(policy)
    dist_mod.init(dist_env, device)
    try:
        return _train(cfg, dist_env, device, policy, requeue_hook)
    finally:
        cpu_kernels.deactivate()  # these were this run's choices; the process may go on to other things
        cpu_allocator.uninstall()
        dist_mod.teardown()


def _train(cfg: TrainConfig, dist_env, device: str, policy, requeue_hook) -> TrainResult:
    is_main = dist_env.is_main
    out_dir = Path(cfg.run.out_dir)
    if is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
    progress = progress_mod.make(cfg.run.progress, is_main, cfg.optim.max_steps, 0)
    say = progress.message

    prepared = prepare_from_config(cfg.data.dataset, cfg.data.data_file, cfg.data.data_dir,
                                   warn=lambda m: say(f"warning: {m}"))
    resume_path, state = _find_resume(cfg, out_dir, say)
    gpt_cfg = _model_config(cfg, prepared.vocab_size, state["model_args"] if state else None, say)
    say_once = say if is_main else lambda _: None  # (building the extensions: one line, not one per rank)
    kernels = _choose_cpu_kernels(cfg.run.cpu_kernels, device, gpt_cfg, policy.precision, say_once)
    allocator = _choose_cpu_allocator(cfg.run.cpu_allocator, device, say_once)
    batches = Batches(prepared, gpt_cfg.block_size, cfg.data.batch_size, cfg.run.seed, dist_env.rank,
                      cfg.data.eval_windows)

    _seed_everything(cfg.run.seed)
    model = GPT(gpt_cfg).to(device)
    model.checkpoint_blocks = cfg.run.activation_checkpointing
    # Dropout noise differs per rank (the weights do not: DDP broadcasts rank 0's at start).
    _seed_everything(cfg.run.seed + 1 + dist_env.rank)
    optimizer = make_optimizer(model, cfg.optim, policy.fused_adamw)
    scaler = torch.amp.GradScaler(policy.device_type, enabled=policy.use_scaler)

    step, best_val, last_val, elapsed_before = 0, None, None, 0.0
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        step = int(state["step"])
        best_val = state.get("best_val_loss")
        elapsed_before = float(state.get("elapsed_s", 0.0))
        if state.get("world_size") == dist_env.world_size:
            ckpt.restore_rng(state["rng"][dist_env.rank])
            batches.load_state_dict(state["data"][dist_env.rank])
        else:
            # A different world size: every rank still gets its own, reproducible stream.
            _seed_everything(cfg.run.seed + 1 + dist_env.rank + 7919 * step)
            batches.generator.manual_seed(cfg.run.seed * 1000 + dist_env.rank + 7919 * step)
            say(f"note: the checkpoint was written by {state.get('world_size')} ranks, this run has "
                f"{dist_env.world_size}; model and optimizer restored, data streams re-derived for step {step}")
        say(f"resumed from {resume_path} at step {step}")

    metrics = MetricsLog(out_dir / "metrics.jsonl", is_main)
    metrics.truncate_after(step)
    if is_main:
        resolved = config_mod.from_dict({**cfg.to_dict(), "model": {k: getattr(gpt_cfg, k) for k in MODEL_KEYS}})
        (out_dir / "config.yaml").write_text(config_mod.dump_yaml(resolved))

    train_model = torch.compile(model) if policy.compile else model
    if dist_env.is_distributed:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp_model = DDP(train_model, device_ids=[int(device.split(":")[1])] if policy.device_type == "cuda" else None)
    else:
        ddp_model = train_model

    o = cfg.optim
    tokens_per_step = cfg.data.batch_size * gpt_cfg.block_size * o.grad_accum * dist_env.world_size
    flops_token = precision_mod.flops_per_token(model.num_params(), gpt_cfg.n_layer, gpt_cfg.n_embd,
                                                gpt_cfg.block_size)
    peak = cfg.run.peak_flops
    if peak is None and policy.device_type == "cuda":
        peak = precision_mod.peak_flops_for(torch.cuda.get_device_name(device))
    handler = preempt_mod.PreemptionHandler(cfg.run.preempt_signal).install()
    restarts = preempt_mod.restart_count()

    progress.close()
    progress = progress_mod.make(cfg.run.progress, is_main, o.max_steps, step)
    say = progress.message
    say(f"tinygpt: {model.num_params():,} parameters (non-embedding), vocab {gpt_cfg.vocab_size}, "
        f"{policy.describe()}, cpu kernels {', '.join(kernels) or 'off'}, "
        f"{f'cpu allocator {allocator}, ' if allocator else ''}"
        f"{dist_env.world_size} rank(s) via {dist_env.launcher}")
    say(f"global batch: {cfg.data.batch_size} x {o.grad_accum} accum x {dist_env.world_size} ranks = "
        f"{cfg.data.batch_size * o.grad_accum * dist_env.world_size} sequences "
        f"({tokens_per_step:,} tokens) per step; data {prepared.meta['source']}")
    hostnames = dist_mod.gather_objects(socket.gethostname(), dist_env)
    if is_main:
        provenance.append(out_dir, provenance.collect(hostnames, dist_env.world_size, device), fresh=state is None)
    metrics.write({"step": step, "event": "start", "resumed_from": str(resume_path) if resume_path else None,
                   "restarts": restarts, "world_size": dist_env.world_size, "launcher": dist_env.launcher,
                   "master": f"{dist_env.master_addr}:{dist_env.master_port}" if dist_env.is_distributed else None,
                   "hostnames": hostnames, "precision": policy.precision, "compile": policy.compile,
                   "cpu_kernels": kernels, "cpu_allocator": allocator, "device": device,
                   "tokens_per_step": tokens_per_step})

    def checkpoint_state() -> dict:
        rng = dist_mod.gather_objects(ckpt.capture_rng(), dist_env)
        data_states = dist_mod.gather_objects(batches.state_dict(), dist_env)
        return {
            "step": step,
            "model": model.state_dict(),  # the plain module's keys, never a compiled or DDP wrapper's
            "model_args": gpt_cfg.to_dict(),
            "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict() if policy.use_scaler else {},
            "config": cfg.to_dict(),
            "rng": rng,
            "data": data_states,
            "world_size": dist_env.world_size,
            "best_val_loss": best_val,
            "elapsed_s": elapsed_before + (time.perf_counter() - t_start),
        }

    def save_checkpoint() -> None:
        state = checkpoint_state()  # a collective: every rank takes part
        if is_main:
            ckpt.save(out_dir, state, keep=cfg.run.keep_checkpoints)

    try:
        t_start = time.perf_counter()
        t_last, step_last = t_start, step
        steps_here = 0
        stop_reason = None
        ddp_model.train()
        with progress:
            while step < o.max_steps:
                lr = lr_at(step, o)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                loss_sum = torch.zeros((), device=device)
                for micro in range(o.grad_accum):
                    x, y = batches.next_train()
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                    last_micro = micro == o.grad_accum - 1
                    sync = nullcontext() if (last_micro or not dist_env.is_distributed) else ddp_model.no_sync()
                    with sync:
                        with policy.autocast():
                            _, loss = ddp_model(x, y)
                            loss = loss / o.grad_accum
                        scaler.scale(loss).backward()
                    loss_sum += loss.detach()
                if o.grad_clip > 0:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                steps_here += 1

                if step % cfg.run.log_interval == 0 or step == o.max_steps:
                    # Averaged over ranks, so every rank sees the same value and stops together.
                    train_loss = dist_mod.mean_over_ranks(loss_sum.item(), device)
                    if not math.isfinite(train_loss):
                        raise TrainingError(
                            f"the training loss became {train_loss} at step {step}; the last good checkpoint is "
                            f"kept in {ckpt.checkpoint_dir(out_dir)}. Lower lr (now {o.lr}) or raise warmup_steps, "
                            f"then resume"
                        )
                    now = time.perf_counter()
                    tok_s = tokens_per_step * (step - step_last) / max(now - t_last, 1e-9)
                    t_last, step_last = now, step
                    record = {"step": step, "train_loss": train_loss, "lr": lr, "tokens_per_s": tok_s,
                              "elapsed_s": elapsed_before + now - t_start}
                    if peak:
                        record["mfu"] = flops_token * tok_s / (peak * dist_env.world_size)
                    metrics.write(record)
                    eta = (o.max_steps - step) * (now - t_start) / max(steps_here, 1)
                    progress.step(step, {**record, "eta_s": eta})

                if step % cfg.run.eval_interval == 0 or step == o.max_steps:
                    losses = evaluate(train_model, batches, policy, device, dist_env)
                    if not math.isfinite(losses["val"]):
                        raise TrainingError(f"the validation loss became {losses['val']} at step {step}; "
                                            f"the last good checkpoint is kept; lower lr and resume")
                    last_val = losses["val"]
                    best_val = last_val if best_val is None else min(best_val, last_val)
                    metrics.write({"step": step, "val_loss": losses["val"], "train_loss": losses["train"],
                                   "elapsed_s": elapsed_before + time.perf_counter() - t_start})
                    say(f"val    {step:>{len(str(o.max_steps))}}/{o.max_steps} | val loss {losses['val']:.4f} | "
                        f"train loss {losses['train']:.4f}")

                if handler.requested or (cfg.run.stop_after and steps_here >= cfg.run.stop_after):
                    stop_reason = "signal" if handler.requested else "stop_after"
                if dist_mod.any_rank(stop_reason is not None, device) and stop_reason is None:
                    stop_reason = "signal"  # another rank was signalled
                if stop_reason or step % cfg.run.ckpt_interval == 0 or step == o.max_steps:
                    save_checkpoint()
                if stop_reason:
                    break

    # The handlers stay until the very end: a signal during the final sample or teardown (the time
    # limit's warning can come late) must not kill a finished run with the default action.
    except BaseException:
        handler.uninstall()
        raise
    try:
        total_s = elapsed_before + time.perf_counter() - t_start
        if stop_reason is not None:
            return _leave_early(cfg, out_dir, step, stop_reason, handler, restarts, metrics, say, dist_env,
                                best_val, last_val, requeue_hook)

        digests = dist_mod.gather_objects(weights_digest(model), dist_env)
        if len(set(digests)) > 1:
            say(f"warning: the ranks' weights differ at the end ({digests}); DDP lost synchronisation")
        sample = None
        if is_main:
            if cfg.run.sample_tokens > 0:
                sample = sample_text(model, prepared, cfg.run.sample_prompt, cfg.run.sample_tokens,
                                     cfg.run.seed, device)
                (out_dir / "samples.txt").write_text(sample + "\n")
                say("--- sample " + "-" * 60)
                say(sample)
                say("-" * 71)
            metrics.write({"step": step, "event": "finished", "best_val_loss": best_val, "elapsed_s": total_s,
                           "weights_digest": digests, "peak_memory_mb": peak_memory_mb(device),
                           "cpu_allocator_stats": cpu_allocator.stats()})
            best = f"{best_val:.4f}" if best_val is not None else "n/a"
            newest = ckpt.list_checkpoints(out_dir)
            say(f"done: step {step}, best val loss {best}, {progress_mod.format_duration(total_s)} of training; "
                f"run directory {out_dir}")
            say(f"  checkpoint: {newest[-1] if newest else 'none'}"
                + (f"\n  samples:    {out_dir / 'samples.txt'}" if sample is not None else "")
                + f"\n  metrics:    {out_dir / 'metrics.jsonl'}")
        return TrainResult(out_dir, step, True, best_val, last_val, 0, sample)
    finally:
        handler.uninstall()


def _leave_early(cfg, out_dir, step, reason, handler, restarts, metrics, say, dist_env, best_val, last_val,
                 requeue_hook=None):
    exit_code = 0
    if reason == "signal" and dist_env.is_main:
        request = handler.request
        why = request.reason if request else "a signal on another rank"
        event = {"step": step, "event": "preempted", "reason": why, "restarts": restarts}
        if request is None or handler.wants_requeue:
            job = preempt_mod.slurm_job_id()
            if restarts >= cfg.run.max_requeues:
                event["requeue"] = f"not requeued: {restarts} restarts reached max_requeues"
            elif requeue_hook is not None:
                event["requeue"] = "handed over to the launcher's requeue mechanism"
                metrics.write(event)
                say(f"stopping at step {step}: {why}; checkpoint saved; requeueing through the launcher")
                requeue_hook()  # may not return (submitit requeues and exits)
                return TrainResult(out_dir, step, False, best_val, last_val, exit_code)
            elif job is None:
                event["requeue"] = "not in a Slurm job; resume by running the same command again"
            else:
                ok, message = preempt_mod.requeue(job)
                event["requeue"] = message
                if not ok:
                    exit_code = preempt_mod.EXIT_REQUEUE
        metrics.write(event)
        say(f"stopping at step {step}: {why}; checkpoint saved. {event.get('requeue', '')}".rstrip())
    elif reason == "stop_after" and dist_env.is_main:
        metrics.write({"step": step, "event": "paused", "reason": "stop_after"})
        say(f"stopping at step {step} (stop_after); run the same command again to continue")
    return TrainResult(out_dir, step, False, best_val, last_val, exit_code)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(config_mod.help_text())
        return 0
    try:
        cfg = config_mod.resolve(argv)
        return train(cfg).exit_code
    except (ConfigError, DataError, TrainingError, precision_mod.PrecisionError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2 if isinstance(err, ConfigError) else 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def exit_process(code: int) -> None:
    """End `python -m tinygpt.train`. A distributed rank leaves without Python's finalisation.

    Everything a run writes is flushed and closed by now (checkpoints are fsynced, the metrics file closed,
    the process group destroyed). What finalisation would still do is run C++ destructors of the
    collective library's threads, and there one rank in about twenty aborted with "terminate called
    without an active exception" (SIGABRT, no Python frame left), failing a finished job.
    Slurm's signals are ignored from here on: the run has nothing more to save (preemption.py).
    """
    preempt_mod.ignore_from_now_on()
    if dist_mod.detect().is_distributed:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    exit_process(main())
