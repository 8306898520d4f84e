"""The parts of a run that a checkpoint holds, besides the model and the optimizer (which PyTorch gives a
`state_dict` already): the loop's own counters, each rank's random streams, and the grad scaler.

Each part saves and loads itself (`state_dict()`, `load_state_dict()`), as torchtitan's checkpointer asks
its stateful parts to; `checkpoint.py` stores what they give and never looks inside. Everything a part
gives is loadable with `torch.load(..., weights_only=True)`: tensors, numbers, strings, lists and dicts.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tinygpt.base.config import ModelConfig
from tinygpt.data import Batches
from tinygpt.model import GPT
from tinygpt.training import checkpoint as ckpt
from tinygpt.training import distributed as dist_mod


@dataclass
class TrainState:
    """Where the loop is: completed steps, the best validation loss, and seconds of training over every
    life of the run (this life's clock starts with `start_clock`), of which `eval_s` went to evaluations."""

    step: int = 0
    best_val_loss: float | None = None
    elapsed_before_s: float = 0.0
    eval_s: float = 0.0
    _clock_start: float = field(default_factory=time.perf_counter, repr=False)

    def start_clock(self) -> None:
        self._clock_start = time.perf_counter()

    def elapsed_s(self) -> float:
        return self.elapsed_before_s + time.perf_counter() - self._clock_start

    def train_s(self) -> float:
        """Seconds of the run so far that did not go to evaluations: what time-to-loss figures count."""
        return self.elapsed_s() - self.eval_s

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "best_val_loss": self.best_val_loss, "elapsed_s": self.elapsed_s(),
                "eval_s": self.eval_s}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.best_val_loss = state["best_val_loss"]
        self.elapsed_before_s = float(state["elapsed_s"])
        self.eval_s = float(state["eval_s"])


class ScalerState:
    """The fp16 grad scaler. Off (bf16, fp32) it saves nothing; a run resumed where it is on, from a
    checkpoint written where it was off, starts with a fresh scale."""

    def __init__(self, scaler: torch.amp.GradScaler):
        self.scaler = scaler

    def state_dict(self) -> dict[str, Any]:
        return self.scaler.state_dict() if self.scaler.is_enabled() else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.scaler.load_state_dict(state)


class RankStreams:
    """Each rank's random number generators (Python, NumPy, torch, CUDA) and its place in the training data.

    Saving gathers every rank's streams to rank 0 (a collective: every rank saves). Loading with as many
    ranks as wrote them continues each stream exactly; with another number of ranks each rank's streams
    are derived anew from the seed and the step, so they stay reproducible and distinct."""

    def __init__(self, batches: Batches, dist: dist_mod.DistEnv, seed: int, train: TrainState,
                 say: Callable[[str], None]):
        self.batches, self.dist, self.seed, self.train, self.say = batches, dist, seed, train, say

    def state_dict(self) -> dict[str, Any]:
        return {"world_size": self.dist.world_size,
                "rng": dist_mod.gather_objects(capture_rng(), self.dist),
                "data": dist_mod.gather_objects(self.batches.state_dict(), self.dist)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        rank, world, step = self.dist.rank, self.dist.world_size, self.train.step
        if state["world_size"] == world:
            restore_rng(state["rng"][rank])
            self.batches.load_state_dict(state["data"][rank])
            return
        seed_everything(self.seed + 1 + rank + 7919 * step)
        self.batches.generator.manual_seed(self.seed * 1000 + rank + 7919 * step)
        self.say(f"note: the checkpoint was written by {state['world_size']} ranks, this run has {world}; "
                 f"model and optimizer restored, data streams re-derived for step {step}")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def model_args(cfg: ModelConfig, vocab_size: int) -> dict[str, Any]:
    """What a checkpoint stores of the model's shape: the ModelConfig's fields and the vocabulary size."""
    return {**cfg.model_dump(), "vocab_size": vocab_size}


def model_config(checkpoint: ckpt.Checkpoint) -> tuple[ModelConfig, int]:
    """The model's shape and vocabulary size as the checkpoint's meta has them (see `model_args`)."""
    try:
        args = dict(checkpoint.meta["model_args"])
        vocab_size = int(args.pop("vocab_size"))
        return ModelConfig(**args), vocab_size
    except (KeyError, TypeError, ValueError) as err:
        raise ckpt.CheckpointError(f"{checkpoint.path}: the model's shape in it is damaged ({err!r})") from None


def model_from(checkpoint: ckpt.Checkpoint) -> GPT:
    """The model a checkpoint holds, on the CPU."""
    model = GPT(*model_config(checkpoint))
    model.load_state_dict(checkpoint.parts["model"])
    return model


# ----------------------------------------------------------------------------------------------------
# RNG state as tensors (weights_only-safe)


def capture_rng() -> dict[str, Any]:
    np_state = np.random.get_state(legacy=False)
    state = {
        "python": _python_rng_to_tensor(random.getstate()),
        "numpy": {
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(_python_rng_from_tensor(state["python"]))
    n = state["numpy"]
    np.random.set_state({
        "bit_generator": "MT19937",
        "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
        "has_gauss": n["has_gauss"],
        "gauss": n["gauss"],
    })
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _python_rng_to_tensor(st: tuple) -> dict[str, Any]:
    version, internal, gauss = st
    return {"version": version, "internal": torch.tensor(internal, dtype=torch.int64),
            "gauss": gauss if gauss is not None else float("nan"), "has_gauss": gauss is not None}


def _python_rng_from_tensor(d: dict[str, Any]) -> tuple:
    return (d["version"], tuple(int(x) for x in d["internal"].tolist()),
            d["gauss"] if d["has_gauss"] else None)
