"""The "remove the mask" exercise in figures: what a model trained without the causal mask has learnt.

Without the mask, position t also sees position t+1, the very character it is asked to predict: training,
and validation measured the same way, read the answer, and the loss falls far below any causal model's.
Generation has no future to read (each new character comes from the past alone, the one thing this model
never had to learn), and its text shows it. The sweep report (tinygpt/report.py) gets, for each run with
`causal: false` and a causal run of the same shape beside it:

- the two training losses at the same step;
- a sample of each, from the same prompt and seed, and the causal model's loss per character on each: on
  its own text about what it expects of the language; on the unmasked model's, far more (it is not text
  of the language they were trained on);
- the unmasked model's attention maps: the bright cells right of the diagonal are it looking ahead.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tinygpt.training import metrics

SHAPE_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "pos_emb", "bias")
SAMPLE_CHARS = 400


def is_causal(run) -> bool:
    """Whether a run (report.RunSummary) trained with the causal mask (runs from before the key was: yes)."""
    return run.config.get("causal", True)


def pairs(runs: list) -> list[tuple]:
    """(unmasked run, the causal run of the same shape it is measured against) for each unmasked run that has one."""
    causal = [r for r in runs if is_causal(r)]
    found = []
    for run in runs:
        if is_causal(run):
            continue
        same = [c for c in causal if all(c.config.get(k) == run.config.get(k) for k in SHAPE_KEYS)]
        if same:
            found.append((run, same[0]))
    return found


def train_losses(run_dir: Path) -> dict[int, float]:
    """{step: training loss} of the run's training lines."""
    return {r["step"]: r["train_loss"] for r in metrics.read(metrics.of_run(run_dir))
            if r.get("train_loss") is not None and "lr" in r}


def loss_per_char(model, prepared, text: str) -> float:
    """The causal model's cross-entropy on `text`, per character, in windows of its context length."""
    import torch
    import torch.nn.functional as F

    vocab = set(prepared.vocab)
    ids = torch.tensor(prepared.encode("".join(ch for ch in text if ch in vocab)))
    span = model.cfg.block_size + 1
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, span - 1):  # (each window holds at least two characters)
            window = ids[start:start + span]
            logits, _ = model(window[None, :-1])
            total += F.cross_entropy(logits[0].float(), window[1:], reduction="sum").item()
            count += len(window) - 1
    return total / count


def section(runs: list, out_dir: Path, load_model: Callable, prepared, draw_attention: Callable) -> list[str]:
    """The report's Markdown lines about each unmasked run (none when the sweep has no such pair)."""
    from tinygpt.training.sampling import sample_text

    lines: list[str] = []
    for unmasked, causal in pairs(runs):
        model_u, model_c = load_model(unmasked), load_model(causal)
        ours, theirs = train_losses(unmasked.run_dir), train_losses(causal.run_dir)
        step = max(set(ours) & set(theirs), default=None)
        seed = int(causal.config.get("seed", 0))
        text_u = sample_text(model_u, prepared, "\n", SAMPLE_CHARS, seed, "cpu")
        text_c = sample_text(model_c, prepared, "\n", SAMPLE_CHARS, seed, "cpu")
        on_own, on_unmasked = loss_per_char(model_c, prepared, text_c), loss_per_char(model_c, prepared, text_u)
        figure = f"attention_{unmasked.name}.png"
        prompt = draw_attention(unmasked, out_dir / figure)
        lines += [
            f"## Without the causal mask: `{unmasked.name}` against `{causal.name}`", "",
            f"`{unmasked.name}` trains with `causal: false`: each position also sees the next character, the "
            f"one it must predict. Its losses read the answer; its generation cannot.", "",
            "| | " + f"`{unmasked.name}` | `{causal.name}` |", "| --- | --- | --- |",
            (f"| training loss at step {step} | {ours[step]:.4f} | {theirs[step]:.4f} |" if step is not None
             else "| training loss | - | - |"),
            f"| best validation loss (measured the same way) | {unmasked.best_val:.4f} | {causal.best_val:.4f} |",
            f"| `{causal.name}`'s loss per character on a {SAMPLE_CHARS}-character sample of each | "
            f"{on_unmasked:.4f} | {on_own:.4f} |", "",
            f"The last row scores generated text with the causal model, which learnt the language: on its own "
            f"sample it finds what it expects, on `{unmasked.name}`'s it finds text it would seldom write.", "",
            f"### `{unmasked.name}`'s sample (prompt a line break, seed {seed})", "", "```", text_u.strip("\n"),
            "```", "", f"### `{causal.name}`'s sample (the same prompt and seed)", "", "```", text_c.strip("\n"),
            "```", "",
            f"### `{unmasked.name}`'s attention, first layer", "",
            f"Prompt: `{prompt!r}`. Row i shows where character i looks; the cells right of the diagonal are "
            f"its future, which a causal model never sees.", "", f"![attention without the mask]({figure})", ""]
    return lines
