"""The learning rate and Adam's beta1 at each step, beside the optimizers they drive (torchtitan keeps its schedulers
beside its optimizers): the trainer asks for both at every step and hands them to `Optimizers.set_lr`.
"""

from __future__ import annotations

import math

from tinygpt.base.config import OptimConfig

ONECYCLE_DIV = 25.0  # schedule: onecycle starts at lr / 25, OneCycleLR's div_factor


def _half_cosine(start: float, end: float, pct: float) -> float:
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1.0)


def _onecycle_phase(step: int, cfg: OptimConfig) -> tuple[bool, float]:
    """Whether `step` is in the rise, and how far along its phase (0 to 1), where OneCycleLR places them: the
    rise ends at step warmup_steps - 1, the fall at the decay's last step."""
    top = cfg.warmup_steps - 1
    if step <= top:
        return True, step / top if top > 0 else 1.0
    last = (cfg.lr_decay_steps or cfg.max_steps) - 1
    return False, min(1.0, (step - top) / (last - top)) if last > top else 1.0


def lr_at(step: int, cfg: OptimConfig) -> float:
    """The learning rate of (0-based) `step`: schedule cosine, a linear warm-up then a cosine decay from lr to
    min_lr over lr_decay_steps; schedule onecycle, OneCycleLR's two half cosines (lr / 25 up to lr, then min_lr)."""
    if cfg.schedule == "onecycle":
        rising, pct = _onecycle_phase(step, cfg)
        return _half_cosine(cfg.lr / ONECYCLE_DIV, cfg.lr, pct) if rising else _half_cosine(cfg.lr, cfg.min_lr, pct)
    decay_steps = cfg.lr_decay_steps or cfg.max_steps
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / (cfg.warmup_steps + 1)
    if step >= decay_steps:
        return cfg.min_lr
    ratio = (step - cfg.warmup_steps) / max(1, decay_steps - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.lr - cfg.min_lr)


def beta1_at(step: int, cfg: OptimConfig) -> float:
    """AdamW's beta1 at `step`: beta1, or with beta1_min, cycled against the rate as OneCycleLR cycles momentum."""
    if cfg.beta1_min is None:
        return cfg.beta1
    rising, pct = _onecycle_phase(step, cfg)
    return _half_cosine(cfg.beta1, cfg.beta1_min, pct) if rising else _half_cosine(cfg.beta1_min, cfg.beta1, pct)
