"""`launch.py cancel SPEC`: every job of a sweep cancelled through its backend, and its heal job stopped (its retry
policy, and the waves it feeds); or, with `--run`, the newest job of each run named, the rest going on."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tinygpt.base import durable
from tinygpt.launch import manifest as manifest_mod
from tinygpt.launch.errors import LaunchError
from tinygpt.launch.read.log_files import find_run
from tinygpt.launch.submit import backends


def cancel(path: Path, runs: Sequence[str] | None = None) -> list[str]:
    """The jobs of the sweep at manifest `path` cancelled under its lock (a heal job deciding now sends nothing
    after this), or only the newest job of each of `runs` (names or numbers; a run cancelled so is never retried);
    their ids, none when no job of it went to Slurm."""
    manifest_mod.load(path)
    with manifest_mod.sweep_lock(path.parent):
        manifest = manifest_mod.load(path)
        backend = backends.of(manifest.backend)
        if runs is not None:
            return backend.cancel(manifest, _submitted(manifest, runs))
        if manifest.retry or manifest.dirs.waves.exists():
            durable.write(manifest.dirs.cancelled, "cancelled by launch.py cancel\n")
        return backend.cancel(manifest)


def _submitted(manifest: manifest_mod.Manifest, runs: Sequence[str]) -> set[int]:
    """The runs' indices, or a LaunchError naming one that is not in the sweep or has no job to cancel; a packed
    run's task holds its neighbours too, so they are named as going with it."""
    tasks = manifest.task_job_ids()
    chosen = {r.index for which in runs for r in find_run(manifest, which)}
    if waiting := sorted(manifest.runs[i].name for i in chosen if i not in tasks):
        raise LaunchError(f"--run: {', '.join(waiting)} never went to Slurm (it waits for a wave, or the sweep was a "
                          f"dry run): nothing of it to cancel; `launch.py cancel SPEC` stops the whole sweep")
    cancelled = {tasks[i] for i in chosen}
    if along := sorted(r.name for r in manifest.runs if r.index not in chosen and tasks.get(r.index) in cancelled):
        raise LaunchError(f"--run: packed in one task with {', '.join(along)}, which would be cancelled too; name "
                          f"them as well, or cancel the whole sweep")
    return chosen
