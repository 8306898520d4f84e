"""A sweep's folders, a manifest made by hand, and the golden files generated text is held to."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.paths import GOLDEN


def hand_made_manifest(workdir: Path, runs: int, submissions: list[dict]):
    """A launched sweep's manifest as a command reads it, made here: `runs` runs under workdir/runs/s/ and these
    submissions (sbatch ones unless they say otherwise)."""
    from tinygpt.launch.manifest import FORMAT, Manifest

    return Manifest.model_validate({
        "format": FORMAT, "name": "s", "workdir": str(workdir), "logs_dir": str(workdir / "logs" / "s"),
        "backend": "sbatch", "base": {}, "code": {}, "resources": {},
        "runs": [{"index": i, "name": f"r{i}", "out_dir": str(workdir / "runs" / "s" / f"r{i}"), "own": {}}
                 for i in range(runs)],
        "submissions": [{"backend": "sbatch", "submitted_at": 0.0, **sub} for sub in submissions]})


def check_golden(name: str, text: str) -> None:
    """`text` equals tests/golden/NAME; TINYGPT_REGEN_GOLDEN=1 writes it there instead (a change on purpose)."""
    path = GOLDEN / name
    if os.environ.get("TINYGPT_REGEN_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; create it with TINYGPT_REGEN_GOLDEN=1 python -m pytest"
    assert text == path.read_text(), (f"{name} differs from what the code gives; if the change is intended, "
                                      f"regenerate with TINYGPT_REGEN_GOLDEN=1 python -m pytest")


def sweep_dirs(workdir: Path, name: str):
    """Where a launched sweep's files are (the launcher's own layout)."""
    from tinygpt.launch.layout import SweepDirs

    return SweepDirs(Path(workdir), name)
