"""How fast a run trains: tokens per second between logged steps, MFU against the device's peak where it is known,
and the time left.
"""

from __future__ import annotations

import time

# Dense bf16 (fp16 for V100) peak FLOP/s per GPU, for MFU. Matched against torch's device name.
PEAK_FLOPS = (
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("A100", 312e12),
    ("A10G", 125e12),
    ("L40S", 362e12),
    ("V100", 125e12),
    ("T4", 65e12),
)


def peak_flops_for(device_name: str) -> float | None:
    for key, value in PEAK_FLOPS:
        if key in device_name:
            return value
    return None


def flops_per_token(non_embedding_params: int, n_layer: int, n_embd: int, block_size: int) -> float:
    """Training FLOPs per token: 6N for the matmuls (forward + backward) plus attention's scores."""
    return 6 * non_embedding_params + 12 * n_layer * n_embd * block_size


class Meter:
    """Speed between logged steps (tokens/s, and MFU against a peak when one is known) and the time left."""

    def __init__(self, tokens_per_step: int, flops_per_token: float, peak_flops: float | None, world: int,
                 max_steps: int, start_step: int):
        self.tokens_per_step, self.flops_per_token = tokens_per_step, flops_per_token
        self.peak_flops, self.world, self.max_steps = peak_flops, world, max_steps
        self.start(start_step)

    def start(self, step: int) -> None:
        self.t0 = self.t_last = time.perf_counter()
        self.step0 = self.step_last = step

    def read(self, step: int) -> dict[str, float]:
        """{"tokens_per_s", "mfu"?} since the last read, and "eta_s" from this life's average pace."""
        now = time.perf_counter()
        tok_s = self.tokens_per_step * (step - self.step_last) / max(now - self.t_last, 1e-9)
        self.t_last, self.step_last = now, step
        out = {"tokens_per_s": tok_s}
        if self.peak_flops:
            out["mfu"] = self.flops_per_token * tok_s / (self.peak_flops * self.world)
        out["eta_s"] = (self.max_steps - step) * (now - self.t0) / max(step - self.step0, 1)
        return out
