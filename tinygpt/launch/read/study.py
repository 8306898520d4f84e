"""An Optuna search's study as the reading commands show it: its trials as rows (`status`), a table of them, and
the sweep report's section with search.png (`report`). Optuna and matplotlib are imported only here, when a
sweep has a study to read.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tinygpt.base import durable
from tinygpt.launch.spec.search import params_text

if TYPE_CHECKING:
    from tinygpt.launch.manifest import Manifest


def trials(manifest: Manifest) -> list[dict[str, Any]]:
    """The trials of an Optuna sweep's study, as rows: number, state, value, pruned at, worker, params."""
    import optuna

    from tinygpt.launch.node import study_journal

    journal = manifest.search.journal
    if not Path(journal).is_file():
        return []
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = study_journal.storage(journal)
    try:
        study = optuna.load_study(study_name=manifest.name, storage=storage)
    except KeyError:  # the journal exists, the study not yet
        return []
    rows = []
    for t in study.get_trials(deepcopy=False):
        last = max(t.intermediate_values) if t.intermediate_values else None
        rows.append({"trial": t.number, "state": t.state.name, "value": t.value,
                     "pruned at": t.user_attrs.get("pruned_at"),
                     "last value": t.intermediate_values[last] if last is not None else None,
                     "worker": t.user_attrs.get("worker"), "params": t.params,
                     "run dir": t.user_attrs.get("run_dir"), "tokens to target": t.user_attrs.get("tokens_to_target")})
    return rows


def trials_table(rows: list[dict[str, Any]], title: str):
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    targeted = any(r.get("tokens to target") is not None for r in rows)  # (value: seconds to the target)
    columns = ("trial", "state", "value", *(["tokens to target"] if targeted else []), "pruned at", "worker", "params")
    for col in columns:
        t.add_column(col, justify="left" if col in ("state", "params") else "right")
    for r in rows:
        tokens = [] if not targeted else ["-" if r["tokens to target"] is None else f"{r['tokens to target']:,}"]
        t.add_row(str(r["trial"]), r["state"], "-" if r["value"] is None else f"{r['value']:.4f}", *tokens,
                  "-" if r["pruned at"] is None else str(r["pruned at"]),
                  "-" if r["worker"] is None else str(r["worker"]), params_text(r["params"]))
    return t


def report_section(rows: list[dict[str, Any]], out_dir: Path) -> str:
    """The search's part of the sweep report: trials ranked, and a plot of each trial's value and the best so
    far (search.png)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if r["state"] == "COMPLETE"]  # (Optuna gives a pruned trial its last value too)
    fig, ax = plt.subplots(figsize=(7, 4))
    best, best_so_far = float("inf"), []
    for r in done:
        best = min(best, r["value"])
        best_so_far.append(best)
    ax.scatter([r["trial"] for r in done], [r["value"] for r in done], label="trial's best val loss")
    ax.step([r["trial"] for r in done], best_so_far, where="post", color="C1", label="best so far")
    pruned = [r for r in rows if r["state"] == "PRUNED" and r["last value"] is not None]
    ax.scatter([r["trial"] for r in pruned], [r["last value"] for r in pruned], marker="x", color="C3",
               label="pruned (its last reported val loss)")
    ax.set_xlabel("trial")
    ax.set_ylabel("validation loss")
    ax.legend()
    fig.tight_layout()
    with durable.replacing(out_dir / "search.png") as fh:
        fig.savefig(fh, format="png", dpi=110)
    plt.close(fig)
    ranked = sorted(done, key=lambda r: r["value"])
    pruned = [r for r in rows if r["state"] == "PRUNED"]
    lines = ["## Search (Optuna)", "", f"{len(rows)} trial(s): {len(done)} complete, {len(pruned)} pruned, "
             f"{sum(r['state'] == 'FAIL' for r in rows)} failed, {sum(r['state'] == 'RUNNING' for r in rows)} running.",
             "", "![search](search.png)", "", "| rank | trial | val loss | params |", "| --- | --- | --- | --- |"]
    lines += [f"| {i + 1} | {r['trial']} | {r['value']:.4f} | {params_text(r['params'])} |"
              for i, r in enumerate(ranked)]
    lines += ["", "Pruned: " + (", ".join(f"trial {r['trial']} at step {r['pruned at']}" for r in pruned) or "none"),
              ""]
    return "\n".join(lines)
