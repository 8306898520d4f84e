"""Pictures and tables of finished runs: loss curves, final losses, samples, attention maps.

    python -m tinygpt.report --run runs/smoke/base          # one run:  <run>/report.md + PNGs
    python launch.py report jobs/exercises.yaml             # a sweep:  runs/<sweep>/report.md + PNGs

The loss plot carries two reference lines: ln(vocab), the loss of a uniform guess, and the validation
loss of a count-based bigram model (add-one smoothing) fitted on the same training split: a transformer
that does not beat the bigram has not learned anything a lookup table cannot. Plots use matplotlib's
non-interactive Agg backend, so reports work on headless nodes.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tinygpt import mask_exercise
from tinygpt.base import durable
from tinygpt.training import metrics
from tinygpt.training.attention import prompt_of


@dataclass
class RunSummary:
    name: str
    run_dir: Path
    config: dict  # flat resolved config
    val_curve: list[tuple[int, float]]
    final_val: float | None
    best_val: float | None
    sample: str | None


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def load_run(run_dir: Path, name: str | None = None) -> RunSummary:
    from tinygpt.base.config import ConfigError, resolve

    run_dir = Path(run_dir)
    try:
        cfg = resolve(["--config", str(run_dir / "config.yaml")]).flat()
    except ConfigError as err:
        raise ReportError(f"{run_dir}: no readable config.yaml ({err}); is this a run directory?") from None
    curve = [(rec["step"], rec["val_loss"]) for rec in metrics.read(metrics.of_run(run_dir))
             if rec.get("val_loss") is not None]
    sample_path = run_dir / "samples.txt"
    sample = sample_path.read_text(errors="replace") if sample_path.exists() else None
    vals = [v for _, v in curve]
    return RunSummary(name or run_dir.name, run_dir, cfg, curve, vals[-1] if vals else None,
                      min(vals) if vals else None, sample)


class ReportError(RuntimeError):
    pass


def bigram_val_loss(prepared) -> float:
    """Validation cross-entropy of a count-based bigram model with add-one smoothing."""
    v = prepared.vocab_size
    train = np.asarray(prepared.tokens("train"), dtype=np.int64)
    val = np.asarray(prepared.tokens("val"), dtype=np.int64)
    counts = np.bincount(train[:-1] * v + train[1:], minlength=v * v).reshape(v, v).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum(axis=1, keepdims=True))
    return float(-logp[val[:-1], val[1:]].mean())


def baselines(prepared) -> dict[str, float]:
    """{'uniform guess': ln(vocab), 'bigram': loss} for the data of a sweep (all its runs share it)."""
    return {f"uniform guess, ln({prepared.vocab_size})": math.log(prepared.vocab_size),
            "count-based bigram": bigram_val_loss(prepared)}


NAMED = 10  # a report names this many runs in its figure's legend and shows their samples: the best ones


def plot_losses(runs: list[RunSummary], refs: dict[str, float], path: Path, title: str) -> None:
    """Every run's validation loss; the NAMED best in colour with their names, any others thin and grey."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    named = {id(run) for run in _ranked(runs)[:NAMED]}
    for run in sorted(runs, key=lambda r: id(r) in named):  # (the named ones drawn last, on top)
        if not run.val_curve:
            continue
        steps, losses = zip(*run.val_curve)
        if id(run) in named:
            ax.plot(steps, losses, marker="o", markersize=3, label=run.name)
        else:
            ax.plot(steps, losses, color="grey", alpha=0.3, linewidth=0.6)
    styles = iter([":", "--", "-."])
    for label, value in refs.items():
        ax.axhline(value, color="grey", linestyle=next(styles), linewidth=1.2, label=f"{label}: {value:.3f}")
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (nats per character)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    with durable.replacing(path) as fh:
        fig.savefig(fh, format="png")
    plt.close(fig)


def load_model(run: RunSummary):
    """(the model of the run's newest valid checkpoint in eval mode, its step)."""
    from tinygpt.training import checkpoint as ckpt
    from tinygpt.training.train_state import model_from

    try:
        checkpoint = ckpt.load_newest(run.run_dir, lambda m: print(f"warning: {m}", file=sys.stderr), ("model",))
        if checkpoint is None:
            raise ReportError(f"{run.run_dir}: no checkpoint to draw from")
        model = model_from(checkpoint)
    except ckpt.CheckpointError as err:
        raise ReportError(str(err)) from None
    return model.eval(), checkpoint.step


def prepared_data(run: RunSummary):
    from tinygpt.data import prepare_from_config

    cfg = run.config
    return prepare_from_config(cfg["dataset"], cfg["data_file"], cfg["data_dir"])


def attention_figure(run: RunSummary, path: Path, prompt: str | None = None, layer: int = 0) -> str:
    """Attention weights of every head of `layer` for a prompt, one panel per head; returns the prompt."""
    import torch

    model, step = load_model(run)
    prepared = prepared_data(run)
    prompt = prompt_of(prepared, model.cfg.block_size, prompt)
    if not prompt:
        raise ReportError("the prompt has no character of the run's vocabulary")
    maps = model.attention_maps(torch.tensor(prepared.encode(prompt)), layer=layer).numpy()
    heads = maps.shape[0]
    cols = min(4, heads)
    rows = math.ceil(heads / cols)
    plt = _plt()
    size = 2.2 + 0.17 * len(prompt)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * size, rows * size), dpi=100, squeeze=False)
    labels = ["␣" if ch == " " else (repr(ch)[1:-1] if ch.isspace() else ch) for ch in prompt]
    for h in range(rows * cols):
        ax = axes[h // cols][h % cols]
        if h >= heads:
            ax.axis("off")
            continue
        ax.imshow(maps[h], cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_title(f"head {h}", fontsize=10)
        ax.set_xticks(range(len(prompt)), labels, fontsize=7)
        ax.set_yticks(range(len(prompt)), labels, fontsize=7)
        ax.set_xlabel("attends to (key)", fontsize=8)
        ax.set_ylabel("query", fontsize=8)
    fig.suptitle(f"{run.name}: attention of layer {layer}, step {step}", fontsize=11)
    fig.tight_layout()
    with durable.replacing(path) as fh:
        fig.savefig(fh, format="png")
    plt.close(fig)
    return prompt


def _ranked(runs: list[RunSummary]) -> list[RunSummary]:
    """Best validation loss first; runs without one last."""
    return sorted(runs, key=lambda r: (r.best_val is None, r.best_val if r.best_val is not None else 0.0))


def _table(runs: list[RunSummary], varying: list[str]) -> list[str]:
    ranked = _ranked(runs)
    head = ["rank", "run", "final val", "best val", *varying]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for i, r in enumerate(ranked, 1):
        fmt = lambda x: "-" if x is None else f"{x:.4f}"  # noqa: E731
        name = f"`{r.name}`" if mask_exercise.is_causal(r) else f"`{r.name}` (no causal mask: reads the answer)"
        cells = [str(i), name, fmt(r.final_val), fmt(r.best_val), *(str(r.config.get(k)) for k in varying)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def write_report(runs: list[RunSummary], out_dir: Path, title: str, varying: list[str],
                 prompt: str | None = None, appendix: str | None = None) -> Path:
    """report.md and its figures in out_dir; `appendix` (Markdown, e.g. the launcher's efficiency table) ends it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    done = [r for r in runs if r.val_curve]
    if not done:
        raise ReportError("no run has a validation loss yet; wait until the runs have evaluated once")
    prepared = prepared_data(done[0])
    refs = baselines(prepared)
    plot_losses(done, refs, out_dir / "val_loss.png", f"{title}: validation loss")
    # The best causal run: an unmasked one scores lowest by reading the answer (tinygpt/mask_exercise.py).
    best = min([r for r in done if mask_exercise.is_causal(r)] or done, key=lambda r: r.best_val)
    used_prompt = attention_figure(best, out_dir / "attention.png", prompt)
    lines = [f"# {title}", "", f"{len(runs)} run(s); lower is better. Reference lines: "
             + ", ".join(f"{k} = {v:.3f}" for k, v in refs.items()) + ".", "",
             "![validation loss](val_loss.png)", "", "## Final and best validation loss", "",
             *_table(runs, varying), "",
             f"## Attention maps of the best run (`{best.name}`), first layer", "",
             f"Prompt: `{used_prompt!r}`. Row i shows where character i looks (its causal past).", "",
             "![attention maps](attention.png)", "",
             "## Samples" + (f" of the {NAMED} best runs" if len(runs) > NAMED else ""), ""]
    for r in _ranked(runs)[:NAMED] if len(runs) > NAMED else runs:
        lines += [f"### {r.name}", "", "```", (r.sample or "(no sample: run not finished)").strip("\n"), "```", ""]
    lines += mask_exercise.section(done, out_dir, lambda run: load_model(run)[0], prepared,
                                   lambda run, path: attention_figure(run, path, used_prompt))
    if appendix:
        lines.append(appendix)
    path = out_dir / "report.md"
    durable.write(path, "\n".join(lines))
    return path


def report_command(runs: list[tuple[Path, str | None]], out_dir: Path, title: str, varying: list[str],
                   prompt: str | None = None, appendix: str | None = None) -> int:
    """Write the report of `runs` ((run directory, name) pairs) into out_dir; print where; exit status."""
    try:
        path = write_report([load_run(run_dir, name) for run_dir, name in runs], out_dir, title, varying, prompt,
                            appendix)
    except ReportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"report: {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tinygpt.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="a run directory")
    parser.add_argument("--prompt", help="prompt for the attention maps (default: the start of the val split)")
    args = parser.parse_args(argv)
    run_dir = Path(args.run)
    return report_command([(run_dir, None)], run_dir, f"run {run_dir.name}", [], args.prompt)


if __name__ == "__main__":
    sys.exit(main())
