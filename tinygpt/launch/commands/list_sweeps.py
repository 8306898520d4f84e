"""`launch.py list [--workdir DIR] [--json]`: every sweep under a work directory, a line each: its name, cluster,
runs by state and when it last changed (its manifest or its submissions, the newer); a sweep this laptop launched
over SSH as its login node lists it. A manifest that cannot be read is listed with why, never skipped."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

from tinygpt.launch import manifest as manifest_mod
from tinygpt.launch.errors import LaunchError
from tinygpt.launch.layout import REMOTE_RECORD, SUBMISSIONS
from tinygpt.launch.read.run_states import collect


def entries(workdir: Path) -> list[dict]:
    """A dict per sweep of `workdir`, by name."""
    found = []
    for path in sorted((workdir / "jobs").glob("*/manifest.json")):
        changed = max(p.stat().st_mtime for p in (path, path.with_name(SUBMISSIONS)) if p.exists())
        entry = {"sweep": path.parent.name, "manifest": str(path), "changed": changed}
        try:
            manifest = manifest_mod.load(path)
        except LaunchError as err:
            found.append({**entry, "problem": str(err)})
            continue
        rows = collect(manifest)
        found.append({**entry, "cluster": manifest.cluster, "runs": len(rows),
                      "states": dict(Counter(r.state.name for r in rows)), "unheard": list(rows.unheard)})
    if any((workdir / "jobs").glob(f"*/{REMOTE_RECORD}")):  # (launched from this laptop over SSH: asked there)
        from tinygpt.launch.remote import laptop

        found += laptop.sweeps_there(workdir)
    return sorted(found, key=lambda e: e["sweep"])


def show(workdir: Path, as_json: bool) -> int:
    found = entries(workdir.resolve())
    if as_json:
        print(json.dumps({"format": 1, "workdir": str(workdir.resolve()), "sweeps": found}, indent=2))
        return 0
    if not found:
        print(f"no sweep under {workdir.resolve()} (its jobs/<sweep>/manifest.json); launch one, or give --workdir")
        return 0
    width = max(len(e["sweep"]) for e in found)
    for e in found:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e["changed"])) if "changed" in e else "-" * 16
        what = f"cannot be read: {e['problem']}" if "problem" in e else (
            f"{e['cluster'] or '-'}  {e['runs']} run(s): "
            + ", ".join(f"{n} {state}" for state, n in sorted(e["states"].items()))
            + (f"  (not heard: {'; '.join(e['unheard'])})" if e["unheard"] else ""))
        print(f"{e['sweep']:<{width}}  {when}  {what}{'  on ' + e['where'] if 'where' in e else ''}")
    return 0
