"""The report of a sweep of a program of the user's (`command:`), runs/<sweep>/report.md: a curve of each named
metric its runs wrote to metrics.jsonl, against the step, every run on one plot; each run's values and the last
of each metric; how the jobs used their allocation. The trainer's samples and attention maps have no meaning
here, and the report says so. matplotlib draws it (the `train` extra, as for the trainer's report).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tinygpt.base import durable
from tinygpt.launch.errors import LaunchError
from tinygpt.training import metrics

if TYPE_CHECKING:
    from tinygpt.launch.manifest import Manifest

def make(manifest: Manifest, efficiency_section: str | None) -> int:
    """Write runs/<sweep>/report.md and a PNG per metric; print where."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise LaunchError("report: drawing needs matplotlib (pip install 'tinygpt-hpc[train]')") from None
    runs = {r.name: metrics.series(metrics.read(metrics.of_run(r.out_dir))) for r in manifest.runs}
    names = sorted({name for found in runs.values() for name in found})
    out = manifest.dirs.runs
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# sweep {manifest.name}", "", f"{len(runs)} run(s) of `{' '.join(manifest.command.argv)}`.", ""]
    for name in names:
        fig, ax = plt.subplots(figsize=(7, 4))
        for run, found in runs.items():
            if found.get(name):
                ax.plot(*zip(*found[name]), label=run)
        ax.set(xlabel="step", ylabel=name, title=f"{manifest.name}: {name}")
        ax.legend(fontsize="small")
        fig.savefig(out / f"{name}.png", dpi=100, bbox_inches="tight")
        plt.close(fig)
        lines += [f"![{name}]({name}.png)", ""]
    lines += _table(manifest, runs, names)
    if not names:
        lines.append("No run wrote a metrics.jsonl with named values: there is nothing to draw.")
    lines += ["", "Samples and attention maps are the TinyGPT trainer's: a program of yours has none here.", ""]
    if efficiency_section:
        lines += [efficiency_section, ""]
    durable.write(out / "report.md", "\n".join(lines))
    print(f"report: {out / 'report.md'} ({len(names)} metric(s) drawn)")
    return 0


def _table(manifest: Manifest, runs: dict[str, dict], names: list[str]) -> list[str]:
    keys = sorted({k for r in manifest.runs for k in r.own})
    head = ["run", *keys, "last step", *[f"last {n}" for n in names]]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for record in manifest.runs:
        found = runs[record.name]
        steps = [s for points in found.values() for s, _ in points]
        cells = [record.name, *[str(record.own.get(k, "")) for k in keys], str(max(steps)) if steps else "-",
                 *[f"{found[n][-1][1]:.6g}" if found.get(n) else "-" for n in names]]
        rows.append("| " + " | ".join(cells) + " |")
    return [*rows, ""]
