"""Experiment trackers (TensorBoard, Weights & Biases) as sinks of the records that go into metrics.jsonl.

metrics.jsonl stays the source of truth; each tracker gets the same records, on rank 0 only, and turns
them into its own form:

    training line   {"step", "train_loss", "lr", "tokens_per_s", "mfu"?}  ->  train/loss, train/lr, ...
    evaluation      {"step", "val_loss", "train_loss"}                     ->  eval/val_loss, eval/train_loss
    finished        {"event": "finished", "best_val_loss"}                 ->  W&B summary

One run is one continuous curve across requeues and resumes. TensorBoard: a resumed run's writer is
opened with `purge_step` just past the checkpoint's step, so what a killed life logged after its last
checkpoint is dropped, as in metrics.jsonl. W&B: the run id is derived from the sweep and run names (a run
started by hand: from its run directory), with `resume="allow"`, so every life continues the same run; a
step it has already seen is dropped by W&B (resume is exact, so it is the same value). W&B's files live
under the run directory; on a node without internet it runs offline and `python launch.py sync SPEC`
uploads the runs later from a login node.

The packages are optional (`pip install -e ".[tracking]"`); asking for a tracker whose package is
missing is an error at start-up, before any training step.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
from pathlib import Path
from urllib.parse import urlparse

from tinygpt.base.config import TRACKING_EXTRA, TrainConfig, dump_yaml

WANDB_REACH_TIMEOUT_S = 3.0


class TrackingError(RuntimeError):
    """A tracker cannot start (its package is missing, ...); shown without a traceback."""


PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}  # logger -> the package it needs


def check_installed(loggers: list[str]) -> None:
    """Raise TrackingError naming the extra when a logger's package cannot be imported."""
    import importlib

    for logger in loggers:
        try:
            importlib.import_module(PACKAGES[logger])
        except ImportError:
            raise TrackingError(f"loggers: {logger} needs the `{PACKAGES[logger]}` package, which is not "
                                f"installed; install the tracking extra ({TRACKING_EXTRA}) or drop {logger} "
                                f"from loggers") from None


def _scalars(record: dict) -> dict[str, float]:
    """The tracker scalars of one metrics.jsonl record, by tag."""
    if "lr" in record:
        names = {"train_loss": "train/loss", "lr": "train/lr", "tokens_per_s": "train/tokens_per_s", "mfu": "train/mfu"}
    elif "val_loss" in record:
        names = {"val_loss": "eval/val_loss", "train_loss": "eval/train_loss"}
    else:
        return {}
    return {tag: float(record[key]) for key, tag in names.items() if record.get(key) is not None}


class TensorBoardSink:
    """Event files under <out_dir>/tensorboard/."""

    def __init__(self, cfg: TrainConfig, out_dir: Path, start_step: int):
        from torch.utils.tensorboard import SummaryWriter

        # Events past the checkpoint (logged by a life that died after it) are purged; the step itself stays.
        purge = start_step + 1 if start_step > 0 else None
        self.writer = SummaryWriter(log_dir=str(out_dir / "tensorboard"), purge_step=purge)
        self.writer.add_text("config", "```yaml\n" + dump_yaml(cfg) + "```", global_step=start_step)

    def write(self, record: dict) -> None:
        for tag, value in _scalars(record).items():
            self.writer.add_scalar(tag, value, global_step=record["step"])

    def close(self) -> None:
        self.writer.close()


def wandb_run_id(cfg: TrainConfig) -> str:
    """The same id for every life of a run: from the sweep and run names, or from the run directory."""
    out_dir = Path(cfg.run.out_dir)
    key = f"{cfg.run.sweep}/{out_dir.name}" if cfg.run.sweep else str(out_dir.resolve())
    readable = re.sub(r"[^A-Za-z0-9_-]+", "-", f"{cfg.run.sweep}-{out_dir.name}" if cfg.run.sweep else out_dir.name)
    return f"{readable.strip('-')[:48]}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def wandb_reachable(timeout_s: float = WANDB_REACH_TIMEOUT_S) -> bool:
    """Whether this node can open a connection to the W&B service ($WANDB_BASE_URL, else W&B's cloud)."""
    url = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai")
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def wandb_mode(cfg: TrainConfig, say) -> str:
    """online or offline: the config's choice, with `auto` deciding by whether the service answers."""
    if cfg.track.wandb_mode != "auto":
        return cfg.track.wandb_mode
    if os.environ.get("WANDB_MODE") in ("online", "offline"):
        return os.environ["WANDB_MODE"]
    if wandb_reachable():
        return "online"
    say("note: W&B cannot be reached from this node; logging offline (upload later: python launch.py sync SPEC, "
        "or wandb sync RUN_DIR/wandb/offline-run-*)")
    return "offline"


class WandbSink:
    """One W&B run per run directory, continued by every requeue and resume."""

    def __init__(self, cfg: TrainConfig, out_dir: Path, say):
        import wandb

        self.run = wandb.init(
            id=wandb_run_id(cfg), resume="allow", dir=str(out_dir), mode=wandb_mode(cfg, say),
            project=cfg.track.wandb_project or os.environ.get("WANDB_PROJECT") or "tinygpt",
            entity=cfg.track.wandb_entity, group=cfg.run.sweep, name=out_dir.name, config=cfg.to_dict(),
            settings=wandb.Settings(silent=True, console="off"),
        )

    def write(self, record: dict) -> None:
        scalars = _scalars(record)
        if scalars and record["step"] >= self.run.step:  # W&B keeps steps increasing; a redone step is the same
            self.run.log(scalars, step=record["step"])
        if "val_loss" in record:
            self.run.summary["final_val_loss"] = record["val_loss"]
        if record.get("event") == "finished":
            self.run.summary["best_val_loss"] = record["best_val_loss"]

    def close(self) -> None:
        self.run.finish()


def open_sinks(cfg: TrainConfig, out_dir: Path, start_step: int, say) -> list:
    """The trackers `cfg.track.loggers` asks for, opened (rank 0 calls this; other ranks log nothing)."""
    check_installed(cfg.track.loggers)
    sinks = []
    try:
        for logger in cfg.track.loggers:
            if logger == "tensorboard":
                sinks.append(TensorBoardSink(cfg, out_dir, start_step))
            elif logger == "wandb":
                sinks.append(WandbSink(cfg, out_dir, say))
    except BaseException:
        for sink in sinks:
            sink.close()
        raise
    return sinks
