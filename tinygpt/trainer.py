"""The training loop: a small `Trainer` (setup, train_step, evaluate, save, close) that every way of
starting a run ends in (`python -m tinygpt.train`, torchrun, srun, the launcher's backends).

A step is one optimizer update; `step` in metrics and checkpoints counts completed updates. The loop:

    for each step: lr from the schedule -> grad_accum micro-batches (gradients synchronised on the last
    one only) -> clip -> optimizer step -> log every log_interval -> evaluate every eval_interval ->
    checkpoint every ckpt_interval -> a stop request (signal, stop_after) ends the loop after a save.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import random
import socket
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from . import checkpoint as ckpt
from . import config as config_mod
from . import distributed as dist_mod
from . import precision as precision_mod
from . import preemption as preempt_mod
from . import progress as progress_mod
from . import provenance, tracking
from .config import ModelConfig, TrainConfig
from .data import Batches, prepare_from_config
from .metrics import MetricsLog
from .model import GPT
from .rundir_lock import RunDirLock
from .sample import sample_text


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
    pruned: bool = False  # stopped by eval_hook (a search's pruner)


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
    """AdamW with weight decay on matrices only: biases and LayerNorm gains do not decay."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused or None)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


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


def train(cfg: TrainConfig, requeue_hook=None, eval_hook=None) -> TrainResult:
    """Train (or continue) the run `cfg` describes.

    requeue_hook: called on rank 0, after the checkpoint is saved, instead of `scontrol requeue` when a
    preemption signal asks for a requeue (the submitit backend hands over to submitit's handler here).
    eval_hook: called as eval_hook(step, val_loss) after each evaluation; a true answer (on any rank) stops
    the run there, saved, as pruned (a search's pruner, e.g. Optuna's, answers it).
    """
    trainer = Trainer(cfg, requeue_hook, eval_hook)
    try:
        trainer.setup()
        return trainer.fit()
    finally:
        trainer.close()


class Trainer:
    def __init__(self, cfg: TrainConfig, requeue_hook=None, eval_hook=None):
        self.cfg = cfg
        self.requeue_hook = requeue_hook
        self.eval_hook = eval_hook
        self.dist = dist_mod.detect()
        self.is_main = self.dist.is_main
        self.out_dir = Path(cfg.run.out_dir)
        self.say = progress_mod.messenger(cfg.run.progress, self.is_main)
        self.progress: progress_mod.Progress | None = None
        self.metrics: MetricsLog | None = None
        self.handler: preempt_mod.PreemptionHandler | None = None
        self.lock: RunDirLock | None = None
        self.step = self.start_step = 0
        self.best_val: float | None = None
        self.last_val: float | None = None
        self.elapsed_before = 0.0
        self.t_start = time.perf_counter()

    # ------------------------------------------------------------------------------------------------
    # setup

    def setup(self) -> None:
        tracking.check_installed(self.cfg.track.loggers)  # on every rank, before anyone waits for rank 0
        if self.is_main:  # before anything in the run directory is touched: one trainer per directory
            self.lock = RunDirLock(self.out_dir).acquire()
        self._place()
        prepared = prepare_from_config(self.cfg.data.dataset, self.cfg.data.data_file, self.cfg.data.data_dir,
                                       warn=lambda m: self.say(f"warning: {m}"))
        resume_path, state = self._find_resume()
        model_cfg = self._model_config(prepared.vocab_size, state)
        # The checkpoint's shape wins, so the config written and checkpointed is the one that runs.
        self.cfg = dataclasses.replace(self.cfg, model=model_cfg)
        self._build(prepared)
        if state is not None:
            self._restore(state)
            self.say(f"resumed from {resume_path} at step {self.step}")
        self._start(prepared, resume_path, fresh=state is None)

    def _place(self) -> None:
        """Threads, device, precision policy and the process group."""
        run = self.cfg.run
        threads = run.threads or int(os.environ.get("SLURM_CPUS_PER_TASK", "0") or 0)
        if threads:
            torch.set_num_threads(threads)
        self.device = precision_mod.pick_device(run.device, self.dist.local_rank)
        self.policy = precision_mod.resolve_policy(self.device, run.precision, run.compile)
        precision_mod.apply(self.policy)
        dist_mod.init(self.dist, self.device)
        if self.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)

    def _find_resume(self):
        if self.is_main:  # one process renames; the others wait, then all find the same newest checkpoint
            ckpt.set_aside_unusable(self.out_dir, self.say)
        dist_mod.barrier()
        mode = self.cfg.run.resume
        if mode == "never":
            return None, None
        if mode == "auto":
            return ckpt.load_newest(self.out_dir, warn=lambda m: self.say(f"warning: {m}"))
        path = Path(mode).expanduser()
        if not path.exists():
            raise TrainingError(f"resume: checkpoint {path} does not exist; give an existing file, auto or never")
        try:
            return path, ckpt.load(path)
        except ckpt.CheckpointError as err:
            raise TrainingError(f"resume: {err}") from None

    def _model_config(self, vocab_size: int, state: dict | None) -> ModelConfig:
        """The model's shape: this run's, or on resume the checkpoint's (which wins, with a note)."""
        wanted = self.cfg.model
        if state is None:
            return wanted
        saved, saved_vocab = ckpt.model_config(state)
        if saved_vocab != vocab_size:
            raise TrainingError(
                f"the checkpoint has a vocabulary of {saved_vocab} characters, the data {vocab_size}: "
                f"it was trained on other data; use --resume never or another --out-dir"
            )
        differs = [f"{f.name}={getattr(saved, f.name)} (asked: {getattr(wanted, f.name)})"
                   for f in dataclasses.fields(saved) if getattr(saved, f.name) != getattr(wanted, f.name)]
        if differs:
            self.say("note: the checkpoint's model settings win over this run's: " + ", ".join(differs))
        return saved

    def _build(self, prepared) -> None:
        """Batches, model, optimizer and grad scaler, seeded."""
        cfg, rank = self.cfg, self.dist.rank
        self.prepared = prepared
        self.batches = Batches(prepared, cfg.model.block_size, cfg.data.batch_size, cfg.run.seed, rank,
                               cfg.data.eval_windows)
        seed_everything(cfg.run.seed)
        self.model = GPT(cfg.model, prepared.vocab_size, cfg.run.activation_checkpointing).to(self.device)
        # Dropout noise differs per rank (the weights do not: DDP broadcasts rank 0's at start).
        seed_everything(cfg.run.seed + 1 + rank)
        self.optimizer = make_optimizer(self.model, cfg.optim, self.policy.fused_adamw)
        self.scaler = torch.amp.GradScaler(self.policy.device_type, enabled=self.policy.use_scaler)

    def _restore(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.step = self.start_step = int(state["step"])
        self.best_val = state.get("best_val_loss")
        self.elapsed_before = float(state.get("elapsed_s", 0.0))
        rank, world = self.dist.rank, self.dist.world_size
        if state.get("world_size") == world:
            ckpt.restore_rng(state["rng"][rank])
            self.batches.load_state_dict(state["data"][rank])
        else:
            # A different world size: every rank still gets its own, reproducible stream.
            seed = self.cfg.run.seed
            seed_everything(seed + 1 + rank + 7919 * self.step)
            self.batches.generator.manual_seed(seed * 1000 + rank + 7919 * self.step)
            self.say(f"note: the checkpoint was written by {state.get('world_size')} ranks, this run has "
                     f"{world}; model and optimizer restored, data streams re-derived for step {self.step}")

    def _start(self, prepared, resume_path: Path | None, fresh: bool) -> None:
        """Wrap the model (compile, DDP), take over the signals, and record the start."""
        cfg, world = self.cfg, self.dist.world_size
        sinks = tracking.open_sinks(cfg, self.out_dir, self.step, self.say) if self.is_main else []
        self.metrics = MetricsLog(self.out_dir / "metrics.jsonl", self.is_main, sinks)
        self.metrics.truncate_after(self.step)
        if self.is_main:
            (self.out_dir / "config.yaml").write_text(config_mod.dump_yaml(cfg))

        self.train_model = torch.compile(self.model) if self.policy.compile else self.model
        self.ddp_model = self.train_model
        if self.dist.is_distributed:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [torch.cuda.current_device()] if self.policy.device_type == "cuda" else None  # set by init
            self.ddp_model = DDP(self.train_model, device_ids=ids)

        self.tokens_per_step = cfg.data.batch_size * cfg.model.block_size * cfg.optim.grad_accum * world
        self.flops_per_token = precision_mod.flops_per_token(self.model.num_params(), cfg.model.n_layer,
                                                             cfg.model.n_embd, cfg.model.block_size)
        self.peak = cfg.run.peak_flops
        if self.peak is None and self.policy.device_type == "cuda":
            self.peak = precision_mod.peak_flops_for(torch.cuda.get_device_name(self.device))
        self.handler = preempt_mod.PreemptionHandler(cfg.run.preempt_signal).install()
        self.restarts = preempt_mod.restart_count()

        self.progress = progress_mod.make(cfg.run.progress, self.is_main, cfg.optim.max_steps, self.step)
        self.say = self.progress.message
        self.say(f"tinygpt: {self.model.num_params():,} parameters (non-embedding), vocab {prepared.vocab_size}, "
                 f"{self.policy.describe()}, {world} rank(s) via {self.dist.launcher}")
        self.say(f"global batch: {cfg.data.batch_size} x {cfg.optim.grad_accum} accum x {world} ranks = "
                 f"{cfg.data.batch_size * cfg.optim.grad_accum * world} sequences "
                 f"({self.tokens_per_step:,} tokens) per step; data {prepared.meta['source']}")
        hostnames = dist_mod.gather_objects(socket.gethostname(), self.dist)
        if self.is_main:
            provenance.append(self.out_dir, provenance.collect(hostnames, world, self.device), fresh=fresh)
        d = self.dist
        self.metrics.write({
            "step": self.step, "event": "start", "resumed_from": str(resume_path) if resume_path else None,
            "restarts": self.restarts, "world_size": world, "launcher": d.launcher,
            "master": f"{d.master_addr}:{d.master_port}" if d.is_distributed else None, "hostnames": hostnames,
            "precision": self.policy.precision, "compile": self.policy.compile, "device": self.device,
            "tokens_per_step": self.tokens_per_step,
        })

    # ------------------------------------------------------------------------------------------------
    # the loop

    def fit(self) -> TrainResult:
        """Train to max_steps, or until a stop request; then finish (sample, summary) or leave early."""
        o, run = self.cfg.optim, self.cfg.run
        self.t_start = time.perf_counter()
        self._t_last, self._step_last = self.t_start, self.step
        stop = None
        self.ddp_model.train()
        with self.progress:
            while self.step < o.max_steps:
                loss = self.train_step()
                if self.step % run.log_interval == 0 or self.step == o.max_steps:
                    self._log_train(loss)
                pruned = False
                if self.step % run.eval_interval == 0 or self.step == o.max_steps:
                    self._log_eval(self.evaluate())
                    pruned = self.eval_hook is not None and dist_mod.any_rank(
                        bool(self.eval_hook(self.step, self.last_val)), self.device)
                # A signal is never dropped for a pruning at the same step: the run leaves saved, and the next
                # life evaluates it again.
                stop = self._stop_reason() or ("pruned" if pruned and self.step < o.max_steps else None)
                if stop or self.step % run.ckpt_interval == 0 or self.step == o.max_steps:
                    self.save()
                if stop:
                    break
        return self._leave_early(stop) if stop else self._finish()

    def train_step(self) -> torch.Tensor:
        """One optimizer update over grad_accum micro-batches; returns the step's loss (a tensor on the device)."""
        o = self.cfg.optim
        self.lr = lr_at(self.step, o)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr
        loss_sum = torch.zeros((), device=self.device)
        for micro in range(o.grad_accum):
            x, y = self.batches.next_train()
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            last_micro = micro == o.grad_accum - 1
            sync = nullcontext() if last_micro or not self.dist.is_distributed else self.ddp_model.no_sync()
            with sync:
                with self.policy.autocast():
                    _, loss = self.ddp_model(x, y)
                    loss = loss / o.grad_accum
                self.scaler.scale(loss).backward()
            loss_sum += loss.detach()
        if o.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), o.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return loss_sum

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean loss over the fixed windows of each split; windows are shared out across ranks."""
        model, d = self.train_model, self.dist
        was_training = model.training
        model.eval()
        out = {}
        for split in ("train", "val"):
            total, count = 0.0, 0
            for i, (x, y) in enumerate(self.batches.eval_batches(split)):
                if i % d.world_size != d.rank:
                    continue
                x, y = x.to(self.device), y.to(self.device)
                with self.policy.autocast():
                    _, loss = model(x, y)
                total += loss.item() * x.size(0)
                count += x.size(0)
            if d.is_distributed:
                t = torch.tensor([total, count], dtype=torch.float64, device=self.device)
                torch.distributed.all_reduce(t)
                total, count = float(t[0]), int(t[1])
            out[split] = total / count
        model.train(was_training)
        return out

    def save(self) -> None:
        """A checkpoint of everything exact continuation needs (a collective: every rank takes part)."""
        state = {
            "step": self.step,
            "model": self.model.state_dict(),  # the plain module's keys, never a compiled or DDP wrapper's
            "model_args": ckpt.model_args(self.cfg.model, self.prepared.vocab_size),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.policy.use_scaler else {},
            "config": self.cfg.to_dict(),
            "rng": dist_mod.gather_objects(ckpt.capture_rng(), self.dist),
            "data": dist_mod.gather_objects(self.batches.state_dict(), self.dist),
            "world_size": self.dist.world_size,
            "best_val_loss": self.best_val,
            "elapsed_s": self._elapsed(),
        }
        if self.is_main:
            ckpt.save(self.out_dir, state, keep=self.cfg.run.keep_checkpoints)

    def _elapsed(self) -> float:
        """Seconds of training in this run's every life so far."""
        return self.elapsed_before + time.perf_counter() - self.t_start

    def _log_train(self, loss: torch.Tensor) -> None:
        o = self.cfg.optim
        # Averaged over ranks, so every rank sees the same value and stops together.
        train_loss = dist_mod.mean_over_ranks(loss.item(), self.device)
        if not math.isfinite(train_loss):
            raise TrainingError(
                f"the training loss became {train_loss} at step {self.step}; the last good checkpoint is kept in "
                f"{ckpt.checkpoint_dir(self.out_dir)}. Lower lr (now {o.lr}) or raise warmup_steps, then resume"
            )
        now = time.perf_counter()
        tok_s = self.tokens_per_step * (self.step - self._step_last) / max(now - self._t_last, 1e-9)
        self._t_last, self._step_last = now, self.step
        record = {"step": self.step, "train_loss": train_loss, "lr": self.lr, "tokens_per_s": tok_s,
                  "elapsed_s": self._elapsed()}
        if self.peak:
            record["mfu"] = self.flops_per_token * tok_s / (self.peak * self.dist.world_size)
        self.metrics.write(record)
        eta = (o.max_steps - self.step) * (now - self.t_start) / max(self.step - self.start_step, 1)
        self.progress.step(self.step, {**record, "eta_s": eta})

    def _log_eval(self, losses: dict[str, float]) -> None:
        if not math.isfinite(losses["val"]):
            raise TrainingError(f"the validation loss became {losses['val']} at step {self.step}; "
                                f"the last good checkpoint is kept; lower lr and resume")
        self.last_val = losses["val"]
        self.best_val = self.last_val if self.best_val is None else min(self.best_val, self.last_val)
        self.metrics.write({"step": self.step, "val_loss": losses["val"], "train_loss": losses["train"],
                            "elapsed_s": self._elapsed()})
        max_steps = self.cfg.optim.max_steps
        self.say(f"val    {self.step:>{len(str(max_steps))}}/{max_steps} | val loss {losses['val']:.4f} | "
                 f"train loss {losses['train']:.4f}")

    def _stop_reason(self) -> str | None:
        """"signal" or "stop_after" when this process should leave after this step; the same on every rank."""
        stop_after = self.cfg.run.stop_after
        reason = None
        if self.handler.requested:
            reason = "signal"
        elif stop_after and self.step - self.start_step >= stop_after:
            reason = "stop_after"
        if dist_mod.any_rank(reason is not None, self.device) and reason is None:
            reason = "signal"  # another rank was signalled
        return reason

    # ------------------------------------------------------------------------------------------------
    # the end

    def _finish(self) -> TrainResult:
        digests = dist_mod.gather_objects(weights_digest(self.model), self.dist)
        if len(set(digests)) > 1:
            self.say(f"warning: the ranks' weights differ at the end ({digests}); DDP lost synchronisation")
        sample = None
        if self.is_main:
            run = self.cfg.run
            if run.sample_tokens > 0:
                sample = sample_text(self.model, self.prepared, run.sample_prompt, run.sample_tokens, run.seed,
                                     self.device)
                (self.out_dir / "samples.txt").write_text(sample + "\n")
                self.say("--- sample " + "-" * 60 + f"\n{sample}\n" + "-" * 71)
            total_s = self._elapsed()
            self.metrics.write({"step": self.step, "event": "finished", "best_val_loss": self.best_val,
                                "elapsed_s": total_s, "weights_digest": digests,
                                "peak_memory_mb": peak_memory_mb(self.device)})
            best = f"{self.best_val:.4f}" if self.best_val is not None else "n/a"
            newest = ckpt.list_checkpoints(self.out_dir)
            self.say(f"done: step {self.step}, best val loss {best}, {progress_mod.format_duration(total_s)} "
                     f"of training; run directory {self.out_dir}")
            self.say(f"  checkpoint: {newest[-1] if newest else 'none'}"
                     + (f"\n  samples:    {self.out_dir / 'samples.txt'}" if sample is not None else "")
                     + f"\n  metrics:    {self.out_dir / 'metrics.jsonl'}")
        return self._result(True, sample=sample)

    def _leave_early(self, reason: str) -> TrainResult:
        """Stopped and saved: say why, and on a preemption signal requeue the job."""
        if not self.is_main:
            return self._result(False)
        if reason == "stop_after":
            self.metrics.write({"step": self.step, "event": "paused", "reason": "stop_after"})
            self.say(f"stopping at step {self.step} (stop_after); run the same command again to continue")
            return self._result(False)
        if reason == "pruned":
            self.metrics.write({"step": self.step, "event": "pruned", "val_loss": self.last_val})
            self.say(f"stopping at step {self.step}: pruned by the search (val loss {self.last_val:.4f})")
            return self._result(False, pruned=True)
        request = self.handler.request
        why = request.reason if request else "a signal on another rank"
        event = {"step": self.step, "event": "preempted", "reason": why, "restarts": self.restarts}
        exit_code = 0
        if request is None or self.handler.wants_requeue:
            job = preempt_mod.slurm_job_id()
            if self.restarts >= self.cfg.run.max_requeues:
                event["requeue"] = f"not requeued: {self.restarts} restarts reached max_requeues"
            elif self.requeue_hook is not None:
                event["requeue"] = "handed over to the launcher's requeue mechanism"
                self.metrics.write(event)
                self.say(f"stopping at step {self.step}: {why}; checkpoint saved; requeueing through the launcher")
                self.requeue_hook()  # may not return (submitit requeues and exits)
                return self._result(False)
            elif os.environ.get("TINYGPT_REQUEUE") == "script":
                event["requeue"] = "left to the batch script (runs packed in one task requeue together)"
                exit_code = preempt_mod.EXIT_REQUEUE
            elif job is None:
                event["requeue"] = "not in a Slurm job; resume by running the same command again"
            else:
                ok, message = preempt_mod.requeue(job)
                event["requeue"] = message
                if not ok:
                    exit_code = preempt_mod.EXIT_REQUEUE
        self.metrics.write(event)
        self.say(f"stopping at step {self.step}: {why}; checkpoint saved. {event.get('requeue', '')}".rstrip())
        return self._result(False, exit_code)

    def _result(self, finished: bool, exit_code: int = 0, sample: str | None = None,
                pruned: bool = False) -> TrainResult:
        return TrainResult(self.out_dir, self.step, finished, self.best_val, self.last_val, exit_code, sample,
                           pruned)

    def close(self) -> None:
        """Give back what setup took. The signal handlers stay until here: a signal during the final sample
        (the time limit's warning can come late) must not kill a finished run with the default action."""
        if self.handler is not None:
            self.handler.uninstall()
        if self.metrics is not None:
            self.metrics.close()
        if self.progress is not None:
            self.progress.close()
        dist_mod.teardown()
        if self.lock is not None:
            self.lock.release()
