"""`launch.py cancel SPEC`: every job of a sweep cancelled through its backend, and its heal job stopped (its retry
policy, and the waves it feeds)."""

from __future__ import annotations

from pathlib import Path

from tinygpt.base import durable
from tinygpt.launch import manifest as manifest_mod
from tinygpt.launch.submit import backends


def cancel(path: Path) -> list[str]:
    """The jobs of the sweep at manifest `path` cancelled under its lock (a heal job deciding now sends nothing
    after this); their ids, none when no job of it went to Slurm."""
    manifest_mod.load(path)
    with manifest_mod.sweep_lock(path.parent):
        manifest = manifest_mod.load(path)
        if manifest.retry or manifest.dirs.waves.exists():
            durable.write(manifest.dirs.cancelled, "cancelled by launch.py cancel\n")
        return backends.of(manifest.backend).cancel(manifest)
