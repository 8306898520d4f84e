"""Text from a model: a prompt continued character by character, for the trainer's samples as it trains and for
`python -m tinygpt.sample` on a trained run.
"""

from __future__ import annotations

from tinygpt.base.config import SAMPLE_TEMPERATURE, SAMPLE_TOP_K


def sample_text(model, prepared, prompt: str, tokens: int, seed: int, device: str,
                temperature: float = SAMPLE_TEMPERATURE, top_k: int | None = SAMPLE_TOP_K) -> str:
    """`prompt` continued by `tokens` sampled characters; characters outside the vocabulary are dropped."""
    import torch

    vocab = set(prepared.vocab)
    prompt = "".join(ch for ch in prompt if ch in vocab) or prepared.vocab[0]
    ids = torch.tensor([prepared.encode(prompt)], dtype=torch.long, device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    was_training = model.training
    model.eval()
    out = model.generate(ids, tokens, temperature=temperature, top_k=top_k, generator=generator)
    model.train(was_training)
    return prepared.decode(out[0].tolist())
