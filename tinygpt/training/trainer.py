"""The training loop: a small `Trainer` (built whole, then fit: train_step, evaluate, save; close) that every way of
starting a run ends in (`python -m tinygpt.train`, torchrun, srun, the launcher's backends).

A step is one optimizer update; `step` in metrics and checkpoints counts completed updates. The loop:

    for each step: lr from the schedule -> grad_accum micro-batches (gradients synchronised on the last
    one only) -> clip -> optimizer step -> log every log_interval -> evaluate every eval_interval ->
    checkpoint every ckpt_interval -> a stop request (signal, stop_after) ends the loop after a save.
"""

from __future__ import annotations

import hashlib
import math
import time
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from tinygpt.base import durable
from tinygpt.base.config import TrainConfig
from tinygpt.data import Batches, prepare_from_config
from tinygpt.model import GPT
from tinygpt.training import attention, tracking, train_state
from tinygpt.training import checkpoint as ckpt
from tinygpt.training import distributed as dist_mod
from tinygpt.training import preemption as preempt_mod
from tinygpt.training import progress as progress_mod
from tinygpt.training import run_setup as setup
from tinygpt.training.metrics import of_run
from tinygpt.training.narration import Reporter
from tinygpt.training.optimizers import OptimizerMismatch, muon_shapes
from tinygpt.training.run_setup import TrainingError
from tinygpt.training.rundir_lock import RunDirLock
from tinygpt.training.sampling import sample_text
from tinygpt.training.schedule import beta1_at, lr_at
from tinygpt.training.watchdog import Watchdog


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


def window_loss_sums(model: GPT, batches: Batches, split: str, device: str, autocast, rank: int = 0,
                     world_size: int = 1) -> tuple[float, int]:
    """The loss summed over the fixed windows of `split` that fall to `rank` (every world_size-th batch), and how
    many windows that was: the arithmetic of every evaluation (bench/ scores a bare loop with it too)."""
    total, count = 0.0, 0
    for i, (x, y) in enumerate(batches.eval_batches(split)):
        if i % world_size != rank:
            continue
        x, y = x.to(device), y.to(device)
        with autocast():
            _, loss = model(x, y)
        total += loss.item() * x.size(0)
        count += x.size(0)
    return total, count


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
    eval_hook: called as eval_hook(step, val_loss, train_s) after each evaluation (train_s: the run's seconds
    so far that were not evaluations); a true answer (on any rank) stops the run there, saved, as pruned (a
    search's pruner, e.g. Optuna's, answers it, and its time budget and target).
    """
    trainer = Trainer(cfg, requeue_hook, eval_hook)
    try:
        return trainer.fit()
    finally:
        trainer.close()




class Trainer:
    """A run, built whole by `__init__` (its directory locked, the device placed, data prepared, the model
    and optimizer built and resumed from the newest checkpoint, signals taken over), trained by `fit`;
    `close` gives back what `__init__` took, in the reverse order. When `__init__` fails halfway, what it
    had taken is given back before the error leaves it.

    The named parts in `self.parts` are what a checkpoint holds, each saving and loading its own state."""

    PARTS = ("model", "optimizer", "scaler", "train", "streams")  # restored in this order

    def __init__(self, cfg: TrainConfig, requeue_hook=None, eval_hook=None):
        self.requeue_hook, self.eval_hook = requeue_hook, eval_hook
        self.dist = dist_mod.detect()
        self.is_main = self.dist.is_main
        self.out_dir = Path(cfg.run.out_dir)
        self.progress = progress_mod.make(cfg.run.progress, self.is_main, cfg.optim.max_steps)
        with ExitStack() as taken:
            tracking.check_installed(cfg.track.loggers)  # on every rank, before anyone waits for rank 0
            if self.is_main:  # before anything in the run directory is touched: one trainer per directory
                taken.enter_context(RunDirLock(self.out_dir))
            # (closed after the process group's teardown, whose barrier waits for every rank: it is watched too)
            self.watchdog = Watchdog(cfg.run.hang_timeout, self.dist.rank, self.dist.world_size,
                                     of_run(self.out_dir),
                                     (lambda: dist_mod.store_client(self.dist)) if self.dist.is_distributed else None,
                                     self.dist.master_addr)
            taken.callback(self.watchdog.close)
            taken.callback(dist_mod.teardown)
            self.device, self.policy = setup.place(cfg.run, self.dist, self.out_dir, muon_shapes(cfg.model, cfg.optim))
            self.prepared = prepare_from_config(cfg.data.dataset, cfg.data.data_file, cfg.data.data_dir,
                                                warn=lambda m: self.say(f"warning: {m}"))
            resume = setup.find_resume(self.out_dir, cfg.run.resume, self.PARTS, self.is_main, self.say)
            # The checkpoint's shape wins, so the config written and checkpointed is the one that runs.
            model_cfg = setup.model_config(cfg.model, resume, self.prepared.vocab_size, self.say)
            self.cfg = cfg = cfg.model_copy(update={"model": model_cfg})

            self.batches, self.model, self.optimizer, self.scaler = setup.build(cfg, self.prepared, self.dist.rank,
                                                                                self.device, self.policy)
            self._name_parts(resume)
            self.start_step = self.state.step
            self.last_val: float | None = None
            self.train_model = setup.wrap(self.model, cfg.run.compile_backend, self.dist, self.policy)
            meter = setup.meter(cfg, self.model, self.dist.world_size, self.device, self.policy, self.start_step)
            self.report = Reporter(cfg, self.out_dir, self.dist, self.progress, meter, self.start_step)
            taken.callback(self.report.close)
            # The signal handlers stay until close: a signal during the final sample (the time limit's warning
            # can come late) must not kill a finished run with the default action.
            self.handler = preempt_mod.PreemptionHandler(cfg.run.preempt_signal).install()
            taken.callback(self.handler.uninstall)
            self.restarts = preempt_mod.restart_count()
            self.report.start(self.start_step, self._described(), self.prepared.meta["source"], self.device,
                              self.policy, resume and resume.path, self.restarts)
            self._taken = taken.pop_all()

    def say(self, text: str) -> None:
        """A message on rank 0 (none when progress is off)."""
        self.progress.message(text)

    def _name_parts(self, resume: ckpt.Checkpoint | None) -> None:
        """The named parts a checkpoint holds (`self.parts`), given their saved state when resuming."""
        self.state = train_state.TrainState()
        self.parts = {"model": self.model, "optimizer": self.optimizer,
                      "scaler": train_state.ScalerState(self.scaler), "train": self.state,
                      "streams": train_state.RankStreams(self.batches, self.dist, self.cfg.run.seed, self.state,
                                                         self.say)}
        if resume is not None:
            try:
                resume.restore(self.parts)
            except (OptimizerMismatch, ckpt.CheckpointFormatError) as err:
                raise TrainingError(f"resume: {err}") from None
            self.say(f"resumed from {resume.path} at step {self.state.step}")

    def _described(self) -> str:
        return (f"{self.model.num_params(non_embedding=False):,} parameters ({self.model.num_params():,} without "
                f"embeddings), vocab {self.prepared.vocab_size}, {self.policy.describe()}")

    # ------------------------------------------------------------------------------------------------
    # the loop

    def fit(self) -> TrainResult:
        """Train to max_steps, or until a stop request; then finish (sample, summary) or leave early."""
        o, run = self.cfg.optim, self.cfg.run
        self.state.start_clock()
        self.report.meter.start(self.state.step)
        stop = None
        self.train_model.train()
        with self.progress.start(self.state.step):
            while self.state.step < o.max_steps:
                loss, lr = self.train_step()
                self.watchdog.beat(self.state.step)
                step = self.state.step
                if step % run.log_interval == 0 or step == o.max_steps:
                    self._log_train(loss, lr)
                pruned = False
                if step % run.eval_interval == 0 or step == o.max_steps:
                    began = time.perf_counter()
                    losses = self.evaluate()
                    self.state.eval_s += time.perf_counter() - began
                    self._log_eval(losses)
                    self.watchdog.beat(self.state.step)
                    pruned = self.eval_hook is not None and dist_mod.any_rank(
                        bool(self.eval_hook(step, self.last_val, self.state.train_s())), self.device)
                # A signal is never dropped for a pruning at the same step: the run leaves saved, and the next
                # life evaluates it again.
                stop = self._stop_reason() or ("pruned" if pruned and step < o.max_steps else None)
                if stop or step % run.ckpt_interval == 0 or step == o.max_steps:
                    self.save()
                    self.watchdog.beat(self.state.step)
                if stop:
                    break
        return self._leave_early(stop) if stop else self._finish()

    def train_step(self) -> tuple[torch.Tensor, float]:
        """One optimizer update over grad_accum micro-batches; returns the step's loss (a tensor on the device)
        and its learning rate."""
        o = self.cfg.optim
        lr = lr_at(self.state.step, o)
        self.optimizer.set_lr(lr, beta1_at(self.state.step, o))
        loss_sum = torch.zeros((), device=self.device)
        for micro in range(o.grad_accum):
            x, y = self.batches.next_train()
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            last_micro = micro == o.grad_accum - 1
            sync = nullcontext() if last_micro or not self.dist.is_distributed else self.train_model.no_sync()
            with sync:
                with self.policy.autocast():
                    _, loss = self.train_model(x, y)
                    loss = loss / o.grad_accum
                self.scaler.scale(loss).backward()
            loss_sum += loss.detach()
        for optimizer in self.optimizer:  # (with fp16: the true gradients, for the clip and the overflow check)
            self.scaler.unscale_(optimizer)
        if o.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), o.grad_clip)
        self.optimizer.step(self.scaler)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.step += 1
        return loss_sum, lr

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean loss over the fixed windows of each split; windows are shared out across ranks, so each rank
        runs its own number of forwards: on the model inside DDP, whose forward would be a collective."""
        model, d = dist_mod.unwrap_ddp(self.train_model), self.dist
        was_training = model.training
        model.eval()
        out = {}
        for split in ("train", "val"):
            total, count = window_loss_sums(model, self.batches, split, self.device, self.policy.autocast, d.rank,
                                            d.world_size)
            if d.is_distributed:
                t = torch.tensor([total, count], dtype=torch.float64, device=self.device)
                torch.distributed.all_reduce(t)
                total, count = float(t[0]), int(t[1])
            out[split] = total / count
        model.train(was_training)
        return out

    def save(self) -> None:
        """A checkpoint of every part (a collective: every rank takes part, rank 0 writes)."""
        meta = {"model_args": train_state.model_args(self.cfg.model, self.prepared.vocab_size),
                "config": self.cfg.to_dict()}
        ckpt.save(self.out_dir, self.state.step, self.parts, meta, keep=self.cfg.run.keep_checkpoints,
                  write=self.is_main)

    def _log_train(self, loss: torch.Tensor, lr: float) -> None:
        step = self.state.step
        # Averaged over ranks, so every rank sees the same value and stops together.
        train_loss = dist_mod.mean_over_ranks(loss.item(), self.device)
        if not math.isfinite(train_loss):
            raise TrainingError(
                f"the training loss became {train_loss} at step {step}; the last good checkpoint is kept in "
                f"{ckpt.checkpoint_dir(self.out_dir)}. Lower lr (now {self.cfg.optim.lr}) or raise warmup_steps, "
                f"then resume"
            )
        scale = self.scaler.get_scale() if self.scaler.is_enabled() else None
        self.report.train_line(step, train_loss, lr, self.state.elapsed_s(), scale)

    def _log_eval(self, losses: dict[str, float]) -> None:
        step = self.state.step
        if not math.isfinite(losses["val"]):
            raise TrainingError(f"the validation loss became {losses['val']} at step {step}; "
                                f"the last good checkpoint is kept; lower lr and resume")
        self.last_val = losses["val"]
        best = self.state.best_val_loss
        self.state.best_val_loss = self.last_val if best is None else min(best, self.last_val)
        self.report.evaluation(step, losses, self.state.elapsed_s(), self.state.train_s())

    def _stop_reason(self) -> str | None:
        """"signal" or "stop_after" when this process should leave after this step; the same on every rank."""
        stop_after = self.cfg.run.stop_after
        reason = None
        if self.handler.requested:
            reason = "signal"
        elif stop_after and self.state.step - self.start_step >= stop_after:
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
                                     self.device, run.sample_temperature, run.sample_top_k or None)
                durable.write(self.out_dir / "samples.txt", sample + "\n")
                self.watchdog.beat(self.state.step)  # (a long sample is progress too)
                self.report.sample(sample)
            attention.write(self.model, self.prepared, self.out_dir, self.state.step)
            newest = ckpt.list_checkpoints(self.out_dir)
            self.report.finished(self.state.step, self.state.best_val_loss, self.state.elapsed_s(), digests,
                                 peak_memory_mb(self.device), newest[-1] if newest else None, sample is not None)
        return self._result(True, sample=sample)

    def _leave_early(self, reason: str) -> TrainResult:
        """Stopped and saved: say why; after a signal, preemption.leave decides on a requeue."""
        step = self.state.step
        if not self.is_main:
            return self._result(False)
        if reason == "stop_after":
            self.report.paused(step)
            return self._result(False)
        if reason == "pruned":
            self.report.pruned(step, self.last_val)
            return self._result(False, pruned=True)
        request = self.handler.request
        why = request.reason if request else "a signal on another rank"
        exit_code = preempt_mod.leave(request, self.restarts, self.cfg.run.max_requeues,
                                      lambda requeue: self.report.preempted(step, why, self.restarts, requeue),
                                      self.requeue_hook)
        return self._result(False, exit_code)

    def _result(self, finished: bool, exit_code: int = 0, sample: str | None = None,
                pruned: bool = False) -> TrainResult:
        return TrainResult(self.out_dir, self.state.step, finished, self.state.best_val_loss, self.last_val,
                           exit_code, sample, pruned)

    def close(self) -> None:
        """Give back what `__init__` took: signal handlers, trackers, the process group, the lock."""
        self._taken.close()
        self.progress.close()
