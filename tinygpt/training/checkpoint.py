"""Checkpoints that a kill at any moment cannot spoil.

    <out_dir>/checkpoints/step_00000040.pt

A checkpoint is written through `durable` (a temporary file, fsynced, renamed into place, the folder
fsynced), so a file with the final name is complete, unless the storage corrupted it afterwards (or
something else was put there): loading checks that the file unpickles, holds every part and matches the
SHA-256 of its contents saved with it (a changed byte of a tensor loads without an error), and a bad
newest checkpoint is skipped with a warning in favour of the one before. When a run starts, every file
that does not load is set aside (renamed `<name>.corrupt`, never deleted), so the newest `keep` (at least
2) that are kept are all usable.

A checkpoint is made of named parts, each an object with `state_dict()` and `load_state_dict()` (the
model, the optimizer, `train_state`'s parts), and `meta`, what the run is (its model's shape, its config).
This module stores what they give and gives it back; it never looks inside a part. Everything is loadable
with `torch.load(..., weights_only=True)`: the parts give tensors, numbers, strings, lists and dicts only.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from tinygpt.base import durable

CHECKPOINT_DIR = "checkpoints"
PATTERN = re.compile(r"^step_(\d{8})\.pt$")
FORMAT_VERSION = 2  # 1: before named parts (never released)
# What to do with a checkpoint of an older format or shape: none was released, so none is converted.
_OLDER = "continue it with the tinygpt that wrote it, or start anew with --resume never or another --out-dir"


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any], /) -> Any: ...


class CheckpointError(RuntimeError):
    pass


class CheckpointFormatError(CheckpointError):
    """A whole checkpoint of a format this version does not read: not damage, so never set aside or skipped."""


@dataclass
class Checkpoint:
    path: Path
    step: int
    meta: dict[str, Any]
    parts: dict[str, Any]

    def restore(self, parts: Mapping[str, Stateful]) -> None:
        """Give each part its saved state, in the order of `parts` (a part may rely on one before it). A state
        of an older shape is refused with what to do, like an older format (CheckpointFormatError), and the file
        is kept: no release wrote one, so none is converted."""
        for name, part in parts.items():
            try:
                part.load_state_dict(self.parts[name])
            except KeyError as err:  # (a part's state of a shape no release wrote: refused, never converted)
                raise CheckpointFormatError(f"{self.path}: its {name} state has no {err}, as a development version "
                                            f"of tinygpt wrote it and no release does; {_OLDER}") from None


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


def save(out_dir: str | Path, step: int, parts: Mapping[str, Stateful], meta: dict[str, Any], keep: int = 3,
         write: bool = True) -> Path:
    """Ask every part for its state and, where `write`, store them as the checkpoint of `step`; then prune to
    the newest `keep`. Called on every rank: a part may gather its state from all of them."""
    states = {name: part.state_dict() for name, part in parts.items()}
    final = path_for_step(out_dir, step)
    if write:
        state = {"format": FORMAT_VERSION, "step": step, "meta": meta, "parts": states}
        try:
            with durable.replacing(final) as fh:
                torch.save({**state, "digest": digest(state)}, fh)
        except RuntimeError as err:  # torch's zip writer reports the OS's refusal (a full disk) as its own
            if isinstance(err.__context__, OSError):
                raise OSError(err.__context__.errno, err.__context__.strerror, str(final)) from None
            raise
        prune(out_dir, max(2, keep))
    return final


def digest(state: Any) -> str:
    """A SHA-256 of everything a checkpoint holds, every tensor's bytes and every other value: a changed
    byte anywhere (a tensor's data, a number in the pickle) loads without an error, so only this shows it."""
    h = hashlib.sha256()

    def walk(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}:".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy())
        elif isinstance(x, dict):
            h.update(b"{")
            for key, value in x.items():
                h.update(repr(key).encode() + b":")
                walk(value)
            h.update(b"}")
        elif isinstance(x, (list, tuple)):
            h.update(b"[" if isinstance(x, list) else b"(")
            for value in x:
                walk(value)
            h.update(b"]")
        else:
            h.update(repr((type(x).__name__, x)).encode() + b",")

    walk(state)
    return h.hexdigest()


def prune(out_dir: str | Path, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints, and leftovers of interrupted writes."""
    for old in list_checkpoints(out_dir)[:-keep]:
        old.unlink(missing_ok=True)
    for tmp in checkpoint_dir(out_dir).glob(f".step_*{durable.TEMP_SUFFIX}"):
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


def load(path: str | Path, required: Collection[str] = (), map_location: str = "cpu",
         mmap: bool = False) -> Checkpoint:
    """Load and check one checkpoint: it must unpickle, be of this format and hold the `required` parts.
    Raises CheckpointFormatError for another format, CheckpointError when it is unreadable or incomplete.

    mmap: map the tensors instead of reading them (a cheap check of a big file)."""
    path = Path(path)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint") from None
    except Exception as err:  # a truncated zip, a corrupt pickle, ...: all mean "not usable"
        raise CheckpointError(f"{path}: unreadable: {_why_unreadable(err)}") from None
    if not isinstance(state, dict) or "format" not in state:
        raise CheckpointError(f"{path}: not a tinygpt checkpoint")
    if state["format"] != FORMAT_VERSION:
        raise CheckpointFormatError(
            f"{path}: a checkpoint of format {state['format']!r}, and this version of tinygpt reads format "
            f"{FORMAT_VERSION}; {_OLDER}")
    parts = state.get("parts")
    missing = [k for k in ("step", "meta", "parts") if k not in state]
    missing += [k for k in required if not isinstance(parts, dict) or k not in parts]
    if missing:
        raise CheckpointError(f"{path}: incomplete, missing {', '.join(missing)}")
    if type(state["step"]) is not int or not isinstance(state["meta"], dict):
        raise CheckpointError(f"{path}: damaged (its step or meta is not what tinygpt writes)")
    saved = state.pop("digest", None)
    if saved is None:
        raise CheckpointFormatError(f"{path}: a checkpoint without a digest, as a development version of tinygpt "
                                    f"wrote it and no release does; {_OLDER}")
    if saved != digest(state):
        raise CheckpointError(f"{path}: damaged (its contents no longer match the digest saved with them)")
    return Checkpoint(path, state["step"], state["meta"], parts)


def set_aside_unusable(out_dir: str | Path, required: Collection[str], say: Callable[[str], None]) -> list[Path]:
    """Rename every checkpoint that does not load and hold every `required` part to `<name>.corrupt` (never
    deleting it), saying why once; returns the new paths. Run once, by one process, when a run starts:
    afterwards retention counts usable checkpoints only, so a bad file can never push out the newest good
    one. A checkpoint of another format is whole, not damaged: it stays, and loading it says what to do."""
    moved = []
    for path in list_checkpoints(out_dir):
        try:
            load(path, required, mmap=True)
        except CheckpointFormatError:
            continue
        except CheckpointError as err:
            target = durable.set_aside(path)
            say(f"warning: set aside {path.name} as {target.name}; {str(err).removeprefix(str(path) + ': ')}")
            moved.append(target)
    return moved


def load_newest(out_dir: str | Path, warn: Callable[[str], None], required: Collection[str] = (),
                map_location: str = "cpu") -> Checkpoint | None:
    """The newest valid checkpoint in `out_dir`, skipping damaged ones with a warning; None when there is
    none. One of another format stops the search (CheckpointFormatError): the run must not start anew
    over a whole checkpoint it cannot read."""
    for path in reversed(list_checkpoints(out_dir)):
        try:
            return load(path, required, map_location)
        except CheckpointFormatError:
            raise
        except CheckpointError as err:
            warn(f"skipping checkpoint {err}")
    return None
