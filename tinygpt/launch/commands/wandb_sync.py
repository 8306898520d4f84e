"""`launch.py sync SPEC`: W&B's own `wandb sync` over the offline W&B runs of a sweep's run directories, from a
login node (compute nodes often have no internet, so the runs log offline there).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tinygpt.launch.errors import LaunchError

if TYPE_CHECKING:
    from tinygpt.launch.manifest import Manifest


def sync(manifest: Manifest, dry_run: bool) -> None:
    offline = sorted(str(d) for r in manifest.runs for d in (Path(r.out_dir) / "wandb").glob("offline-run-*"))
    if not offline:
        print(f"nothing to sync: no offline W&B run under the run directories of sweep {manifest.name}")
        return
    wandb = shutil.which("wandb") or str(Path(sys.executable).parent / "wandb")
    if not Path(wandb).exists():
        from tinygpt.base.config import TRACKING_EXTRA

        raise LaunchError(f"sync: the `wandb` command is not installed here; {TRACKING_EXTRA}")
    print(f"syncing {len(offline)} offline W&B run(s) (each life of a run is one) of sweep {manifest.name}",
          flush=True)
    done = subprocess.run([wandb, "sync", *(["--dry-run"] if dry_run else []), *offline])
    if done.returncode != 0:
        raise LaunchError(f"sync: wandb sync exited with status {done.returncode}; its output is above")
