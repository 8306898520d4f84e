"""Attention maps: every head's weights over a short prompt, written by a run as it ends (attention.json in its
directory, which `launch.py serve` draws on a run's page without torch) and drawn by `report` for the best run.
"""

from __future__ import annotations

from pathlib import Path

from tinygpt.base import durable

FILE_NAME = "attention.json"
PROMPT_CHARS = 24  # the prompt's length at most: a map is PROMPT_CHARS x PROMPT_CHARS cells a head
DIGITS = 3  # a weight's decimals in the file


def prompt_of(prepared, block_size: int, prompt: str | None = None) -> str:
    """`prompt` in the run's vocabulary and context, or the start of the validation text."""
    if prompt is None:
        prompt = prepared.decode(prepared.tokens("val")[:min(block_size, PROMPT_CHARS)])
    return "".join(ch for ch in prompt if ch in set(prepared.vocab))[:block_size]


def write(model, prepared, out_dir: Path, step: int) -> None:
    """attention.json: {"step", "prompt": [characters], "layers": [layer][head][query][key]} of the model now."""
    import json

    import torch

    prompt = prompt_of(prepared, model.cfg.block_size)
    if not prompt:
        return
    ids = torch.tensor(prepared.encode(prompt), device=next(model.parameters()).device)
    with torch.no_grad():
        layers = [model.attention_maps(ids, layer).float().cpu().numpy().round(DIGITS).tolist()
                  for layer in range(model.cfg.n_layer)]
    durable.write(out_dir / FILE_NAME, json.dumps({"step": step, "prompt": list(prompt), "layers": layers}) + "\n")
