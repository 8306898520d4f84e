"""What a run tells as it trains: its start (the console, metrics.jsonl, provenance.json, config.yaml), a line every
log_interval, each evaluation, and its end: finished, paused, pruned or preempted. The Trainer decides what
happens; a `Reporter` says it, on rank 0 (the other ranks' records go nowhere).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tinygpt.base import config as config_mod
from tinygpt.base import durable
from tinygpt.base.config import TrainConfig
from tinygpt.training import distributed as dist_mod
from tinygpt.training import provenance, tracking
from tinygpt.training.metrics import MetricsLog, of_run
from tinygpt.training.progress import Progress, format_duration

if TYPE_CHECKING:
    from tinygpt.training.precision import Policy
    from tinygpt.training.speed import Meter


class Reporter:
    """The run's voice: `progress` on the console, and metrics.jsonl (with its trackers) from `start_step` on."""

    def __init__(self, cfg: TrainConfig, out_dir: Path, dist: dist_mod.DistEnv, progress: Progress,
                 meter: Meter, start_step: int):
        self.cfg, self.out_dir, self.dist, self.progress, self.meter = cfg, out_dir, dist, progress, meter
        sinks = tracking.open_sinks(cfg, out_dir, start_step, self.say) if dist.is_main else []
        self.metrics = MetricsLog(of_run(out_dir), dist.is_main, sinks)
        self.metrics.truncate_after(start_step)  # (a step redone after a crash appears once)

    def say(self, text: str) -> None:
        """A message on rank 0 (none when progress is off)."""
        self.progress.message(text)

    def start(self, step: int, what: str, data_source: str, device: str, policy: Policy,
              resumed_from: Path | None, restarts: int) -> None:
        """Say what runs (`what`: the model and the precision policy, in words), and record the start in
        config.yaml, metrics.jsonl and provenance.json."""
        cfg, d, world = self.cfg, self.dist, self.dist.world_size
        if d.is_main:
            durable.write(self.out_dir / "config.yaml", config_mod.dump_yaml(cfg))
        self.say(f"tinygpt: {what}, {world} rank(s) via {d.launcher}")
        self.say(f"global batch: {cfg.data.batch_size} x {cfg.optim.grad_accum} accum x {world} ranks = "
                 f"{cfg.data.batch_size * cfg.optim.grad_accum * world} sequences "
                 f"({self.meter.tokens_per_step:,} tokens) per step; data {data_source}")
        # Which dtype Muon orthogonalised in, and why (its matrices' time in bf16 against fp32's here, or the GPU)
        muon_path = {"muon_precision": policy.orthogonalise, "muon_precision_why": policy.orthogonalise_why} \
            if policy.orthogonalise else {}
        ranks = dist_mod.gather_objects(provenance.placement(), d)
        hostnames = [rank.pop("host") for rank in ranks]
        if d.is_main:
            provenance.append(self.out_dir, {**provenance.collect(hostnames, world, device), **muon_path},
                              fresh=resumed_from is None)
        self.metrics.write({
            "step": step, "event": "start", "resumed_from": str(resumed_from) if resumed_from else None,
            "restarts": restarts, "world_size": world, "launcher": d.launcher,
            "master": f"{d.master_addr}:{d.master_port}" if d.is_distributed else None, "hostnames": hostnames,
            "cpus": ranks,  # each rank's: Slurm's CPUs per task, its affinity set's size, torch's threads
            "precision": policy.precision, "compile": policy.compile, "device": device, **muon_path,
            "tokens_per_step": self.meter.tokens_per_step,
        })

    def train_line(self, step: int, train_loss: float, lr: float, elapsed_s: float,
                   loss_scale: float | None) -> None:
        speed = self.meter.read(step)
        eta = speed.pop("eta_s")
        record = {"step": step, "train_loss": train_loss, "lr": lr, **speed, "elapsed_s": elapsed_s}
        if loss_scale is not None:  # fp16: the loss scale halves at each step whose gradients overflowed
            record["loss_scale"] = loss_scale
        self.metrics.write(record)
        self.progress.step(step, {**record, "eta_s": eta})

    def evaluation(self, step: int, losses: dict[str, float], elapsed_s: float, train_s: float) -> None:
        self.metrics.write({"step": step, "val_loss": losses["val"], "train_loss": losses["train"],
                            "elapsed_s": elapsed_s, "train_s": train_s})
        max_steps = self.cfg.optim.max_steps
        self.say(f"val    {step:>{len(str(max_steps))}}/{max_steps} | val loss {losses['val']:.4f} | "
                 f"train loss {losses['train']:.4f}")

    def sample(self, text: str) -> None:
        self.say("--- sample " + "-" * 60 + f"\n{text}\n" + "-" * 71)

    def finished(self, step: int, best: float | None, total_s: float, digests: list[str], peak_memory_mb: float,
                 newest_checkpoint: Path | None, sampled: bool) -> None:
        self.metrics.write({"step": step, "event": "finished", "best_val_loss": best, "elapsed_s": total_s,
                            "weights_digest": digests, "peak_memory_mb": peak_memory_mb})
        self.say(f"done: step {step}, best val loss {f'{best:.4f}' if best is not None else 'n/a'}, "
                 f"{format_duration(total_s)} of training; run directory {self.out_dir}")
        self.say(f"  checkpoint: {newest_checkpoint or 'none'}"
                 + (f"\n  samples:    {self.out_dir / 'samples.txt'}" if sampled else "")
                 + f"\n  metrics:    {of_run(self.out_dir)}")

    def paused(self, step: int) -> None:
        self.metrics.write({"step": step, "event": "paused", "reason": "stop_after"})
        self.say(f"stopping at step {step} (stop_after); run the same command again to continue")

    def pruned(self, step: int, val_loss: float) -> None:
        self.metrics.write({"step": step, "event": "pruned", "val_loss": val_loss})
        self.say(f"stopping at step {step}: pruned by the search (val loss {val_loss:.4f})")

    def preempted(self, step: int, why: str, restarts: int, requeue: str | None) -> None:
        event = {"step": step, "event": "preempted", "reason": why, "restarts": restarts}
        self.metrics.write(event if requeue is None else {**event, "requeue": requeue})
        self.say(f"stopping at step {step}: {why}; checkpoint saved. {requeue or ''}".rstrip())

    def close(self) -> None:
        self.metrics.close()
