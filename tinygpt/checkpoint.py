"""Checkpoints that a kill at any moment cannot spoil.

    <out_dir>/checkpoints/step_00000040.pt

A checkpoint is written to a hidden temporary file in the same folder, flushed and fsynced, then renamed
into place (rename is atomic on POSIX), and the folder is fsynced so the rename itself survives a
crash. A file with the final name is therefore complete, unless the storage corrupted it afterwards (or
something else was put there): loading checks that the file unpickles and holds every part, and a bad
newest checkpoint is skipped with a warning in favour of the one before. When a run starts, every file
that does not load is set aside (renamed `<name>.corrupt`, never deleted), so the newest `keep` (at least
2) that are kept are all usable.

Everything is loadable with `torch.load(..., weights_only=True)`: tensors, numbers, strings, lists and
dicts only; RNG states are converted to tensors.
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .config import ModelConfig

CHECKPOINT_DIR = "checkpoints"
PATTERN = re.compile(r"^step_(\d{8})\.pt$")
REQUIRED_KEYS = ("format", "step", "model", "model_args", "optimizer", "config", "rng", "data")
FORMAT_VERSION = 1

# Tests may set this to slow writes down and widen the window for a kill mid-write.
_WRITE_DELAY_ENV = "TINYGPT_TEST_SLOW_CHECKPOINT_S"


class CheckpointError(RuntimeError):
    pass


def checkpoint_dir(out_dir: str | Path) -> Path:
    return Path(out_dir) / CHECKPOINT_DIR


def path_for_step(out_dir: str | Path, step: int) -> Path:
    return checkpoint_dir(out_dir) / f"step_{step:08d}.pt"


def list_checkpoints(out_dir: str | Path) -> list[Path]:
    """Complete-named checkpoints, oldest first."""
    folder = checkpoint_dir(out_dir)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if PATTERN.match(p.name))


def model_args(cfg: ModelConfig, vocab_size: int) -> dict[str, Any]:
    """What a checkpoint stores of the model's shape: the ModelConfig's fields and the vocabulary size."""
    return {**dataclasses.asdict(cfg), "vocab_size": vocab_size}


def model_config(state: dict[str, Any]) -> tuple[ModelConfig, int]:
    """The model's shape and vocabulary size as a checkpoint saved them (see `model_args`)."""
    args = dict(state["model_args"])
    vocab_size = int(args.pop("vocab_size"))
    return ModelConfig(**args), vocab_size


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


# ----------------------------------------------------------------------------------------------------
# Save and load


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save(out_dir: str | Path, state: dict[str, Any], keep: int = 3) -> Path:
    """Write `state` as the checkpoint of `state['step']` atomically; prune to the newest `keep`."""
    folder = checkpoint_dir(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    final = path_for_step(out_dir, int(state["step"]))
    state = {"format": FORMAT_VERSION, **state}
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{final.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            delay = float(os.environ.get(_WRITE_DELAY_ENV, "0") or 0)
            if delay > 0:
                time.sleep(delay)
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(folder)
    prune(out_dir, max(2, keep))
    return final


def prune(out_dir: str | Path, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints, and leftovers of interrupted writes."""
    for old in list_checkpoints(out_dir)[:-keep]:
        old.unlink(missing_ok=True)
    for tmp in checkpoint_dir(out_dir).glob(".step_*.tmp"):
        tmp.unlink(missing_ok=True)


def _why_unreadable(err: Exception) -> str:
    """What was wrong with a file, in our words. PyTorch's own message for a file holding arbitrary objects
    advises loading it with weights_only=False, which would run whatever code the file carries."""
    text = str(err)
    if "Weights only" in text and "global" in text.lower():  # the unpickler met a class or function to import
        return ("it holds objects other than tensors and plain data, so tinygpt did not write it; "
                "it was not loaded")
    if "Weights only" in text:
        return "not a whole checkpoint file (its contents are damaged or of another kind)"
    if "zip" in text:  # torch.save writes a zip archive; PyTorch's reader names what it could not find
        return "not a whole checkpoint file (no complete zip archive: cut short, damaged, or another kind of file)"
    first = text.strip().split(". ")[0].splitlines()[0][:160] if text.strip() else ""
    return f"not a whole checkpoint file ({type(err).__name__}{': ' + first if first else ''})"


def load(path: str | Path, map_location: str = "cpu", mmap: bool = False) -> dict[str, Any]:
    """Load and check one checkpoint; raise CheckpointError when it is unreadable or incomplete.

    mmap: map the tensors instead of reading them (a cheap check of a big file)."""
    path = Path(path)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint") from None
    except Exception as err:  # a truncated zip, a corrupt pickle, ...: all mean "not usable"
        raise CheckpointError(f"{path}: unreadable: {_why_unreadable(err)}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: not a tinygpt checkpoint")
    missing = [k for k in REQUIRED_KEYS if k not in state]
    if missing:
        raise CheckpointError(f"{path}: incomplete, missing {', '.join(missing)}")
    if state["format"] != FORMAT_VERSION:
        raise CheckpointError(f"{path}: format {state['format']}, this version reads {FORMAT_VERSION}")
    return state


def set_aside_unusable(out_dir: str | Path, say: Callable[[str], None]) -> list[Path]:
    """Rename every checkpoint that does not load and hold every part to `<name>.corrupt` (never deleting
    it), saying why once; returns the new paths. Run once, by one process, when a run starts: afterwards
    retention counts usable checkpoints only, so a bad file can never push out the newest good one."""
    moved = []
    for path in list_checkpoints(out_dir):
        try:
            load(path, mmap=True)
        except CheckpointError as err:
            target = path.with_name(path.name + ".corrupt")
            n = 1
            while target.exists():
                target, n = path.with_name(f"{path.name}.corrupt.{n}"), n + 1
            os.replace(path, target)
            say(f"warning: set aside {path.name} as {target.name}; {str(err).removeprefix(str(path) + ': ')}")
            moved.append(target)
    return moved


def load_newest(out_dir: str | Path, warn: Callable[[str], None], map_location: str = "cpu"):
    """(path, state) of the newest valid checkpoint in `out_dir`, skipping bad ones; (None, None)."""
    for path in reversed(list_checkpoints(out_dir)):
        try:
            return path, load(path, map_location)
        except CheckpointError as err:
            warn(f"skipping checkpoint {err}")
    return None, None
