"""The optimizers a run trains with: AdamW, or Muon for the blocks' matrices with AdamW for the rest.

`optimizer: adamw` (the default): AdamW for every parameter, weight decay on matrices (`weight_decay_on`).
`optimizer: muon`: PyTorch's `torch.optim.Muon` (torch 2.9 and later; see below) for the 2-D weight matrices inside
the blocks (attention's qkv and output projections, the MLP's two layers), and AdamW for the rest: the token
and position embeddings (the output head is tied to the token embedding), LayerNorm gains and biases. This is
the split of Muon's authors and of modded-nanogpt: orthogonalising an update suits a hidden linear map, not a
table of rows looked up (embeddings) nor the classifier that reads them out, and a 1-D parameter has no
matrix to orthogonalise. Each part has its own peak rate (`lr`, `muon_lr`); one schedule scales both.

Muon orthogonalises each update with a few Newton-Schulz steps of matrix products, which torch runs in bf16. On
a CPU whose bf16 matmul is a serial fallback (tens of times slower than fp32) that step dominates training, so
the precision policy (precision.py) says which dtype it runs in, from what this CPU does (`Muon` below: the same
update as torch's, its matrices orthogonalised in batches of one shape, in bf16 or fp32, with torch's state).

Both parts are stepped together and checkpointed as one part of a checkpoint, `Optimizers`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tinygpt.base.config import ModelConfig, OptimConfig
from tinygpt.model import GPT

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


class OptimizerMismatch(ValueError):
    """A checkpoint's optimizer state is not of the optimizer this run asks for."""


def muon_parameters(model: GPT) -> set[str]:
    """The names of the parameters Muon trains: the 2-D weights inside the blocks."""
    return {name for name, p in model.named_parameters() if p.requires_grad and p.dim() == 2
            and name.startswith("blocks.")}


def muon_shapes(model: ModelConfig, optim: OptimConfig) -> list[tuple[int, int]] | None:
    """The shapes of the matrices Muon orthogonalises at each step of a run (`muon_parameters`' of each block),
    which the precision policy times in both dtypes (bf16_probe.py); None for a run without Muon."""
    c = model.n_embd
    return [(3 * c, c), (c, c), (4 * c, c), (c, 4 * c)] * model.n_layer if optim.optimizer == "muon" else None


def torchs_iteration() -> tuple[tuple[float, float, float], int, float]:
    """torch.optim.Muon's own Newton-Schulz settings, (coefficients, steps, eps), read from its defaults."""
    defaults = torch.optim.Muon([torch.nn.Parameter(torch.zeros(1, 1))]).defaults
    return defaults["ns_coefficients"], defaults["ns_steps"], defaults["eps"]


def orthogonalise(updates: list[torch.Tensor], coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype) -> list[torch.Tensor]:
    """Muon's quintic Newton-Schulz iteration on each update, in `dtype`: the operations of torch.optim.Muon's
    `_zeropower_via_newtonschulz` (which runs them one matrix at a time, in bf16), on the updates of one shape as
    one batch. A model's blocks repeat their shapes, and one batched product of small matrices runs at a fraction
    of the time of its matrices one by one (bench/bf16_paths.py)."""
    a, b, c = coefficients
    shapes: dict[torch.Size, list[int]] = {}
    for i, update in enumerate(updates):
        shapes.setdefault(update.shape, []).append(i)
    out: list[torch.Tensor] = [updates[0]] * len(updates)
    for shape, indices in shapes.items():
        x = torch.stack([updates[i] for i in indices]).to(dtype)
        if shape[0] > shape[1]:
            x = x.mT  # (the Gram matrix of the shorter side)
        x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)  # a spectral norm of at most 1
        for _ in range(steps):
            gram = x @ x.mT
            x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
        if shape[0] > shape[1]:
            x = x.mT
        for position, i in enumerate(indices):
            out[i] = x[position]
    return out


# (torch before 2.9 has no Muon: the class stands on Optimizer there, and asking for it says what to install)
class Muon(getattr(torch.optim, "Muon", torch.optim.Optimizer)):
    """torch.optim.Muon's update, its matrices orthogonalised in `dtype` and in batches of one shape
    (`orthogonalise`); torch.optim.Muon's state (a momentum buffer per matrix), so either resumes the other."""

    def __init__(self, params, dtype: torch.dtype, **options: Any):
        super().__init__(params, **options)
        self.dtype = dtype

    @torch.no_grad()
    def step(self, closure=None):
        with torch.enable_grad():
            loss = closure() if closure is not None else None
        for group in self.param_groups:
            params, grads, buffers = [], [], []
            self._init_group(group, params, grads, buffers)
            updates = []
            for grad, buffer in zip(grads, buffers):
                buffer.lerp_(grad, 1 - group["momentum"])
                updates.append(grad.lerp(buffer, group["momentum"]) if group["nesterov"] else buffer)
            updates = orthogonalise(updates, group["ns_coefficients"], group["ns_steps"], group["eps"], self.dtype)
            for param, update in zip(params, updates):
                param.mul_(1 - group["lr"] * group["weight_decay"])
                param.add_(update, alpha=-group["lr"] * _lr_scale(group["adjust_lr_fn"], param.shape))
        return loss


def _lr_scale(adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """torch.optim.Muon's scaling of the rate by a matrix's shape (`adjust_lr_fn`)."""
    rows, cols = shape[:2]
    return 0.2 * math.sqrt(max(rows, cols)) if adjust_lr_fn == "match_rms_adamw" else math.sqrt(max(1, rows / cols))


class Optimizers:
    """AdamW alone, or Muon and AdamW side by side: what the trainer steps, schedules and checkpoints."""

    def __init__(self, model: GPT, cfg: OptimConfig, fused: bool, orthogonalise_in: str = "bf16"):
        self.cfg = cfg
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        to_muon = muon_parameters(model) if cfg.optimizer == "muon" else set()
        matrices = [p for n, p in named if p.dim() >= 2 and n not in to_muon]
        vectors = [p for n, p in named if p.dim() < 2]  # biases, LayerNorm gains: decayed only with "all"
        groups = [{"params": matrices, "weight_decay": cfg.weight_decay},
                  {"params": vectors, "weight_decay": cfg.weight_decay if cfg.weight_decay_on == "all" else 0.0}]
        self.parts: dict[str, torch.optim.Optimizer] = {
            "adamw": torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused or None)}
        if to_muon:
            if not hasattr(torch.optim, "Muon"):
                raise OptimizerMismatch(f"optimizer: muon needs torch 2.9 or later (torch.optim.Muon), and this is "
                                        f"torch {torch.__version__}; install torch>=2.9, or use optimizer: adamw")
            self.parts["muon"] = Muon([p for n, p in named if n in to_muon], DTYPES[orthogonalise_in],
                                      lr=cfg.muon_lr, momentum=cfg.muon_momentum, weight_decay=cfg.muon_weight_decay)

    @property
    def kind(self) -> str:
        return self.cfg.optimizer

    def set_lr(self, lr: float, beta1: float) -> None:
        """This step's AdamW rate `lr` and beta1 (the schedule's); Muon's rate is its own peak scaled the same way."""
        rates = {"adamw": lr, "muon": self.cfg.muon_lr * lr / self.cfg.lr}
        for name, optimizer in self.parts.items():
            for group in optimizer.param_groups:
                group["lr"] = rates[name]
                if name == "adamw":
                    group["betas"] = (beta1, self.cfg.beta2)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [group for optimizer in self.parts.values() for group in optimizer.param_groups]

    def __iter__(self):
        return iter(self.parts.values())

    def step(self, scaler: torch.amp.GradScaler) -> None:
        """Step every part through the grad scaler (its gradients unscaled already), or none: with fp16, a step
        whose gradients overflowed anywhere is skipped as a whole, where each part's own check would skip only
        the parts that overflowed. The scaler's update still sees the overflow and lowers its scale."""
        if scaler.is_enabled() and len(self.parts) > 1:
            grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
            if not torch.stack([torch.isfinite(g).all() for g in grads]).all():
                return
        for optimizer in self.parts.values():
            scaler.step(optimizer)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.parts.values():
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **{name: optimizer.state_dict() for name, optimizer in self.parts.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["kind"] != self.kind:
            raise OptimizerMismatch(f"the checkpoint was trained with optimizer {state['kind']}, and this run "
                                    f"asks for {self.kind}; resume with --optimizer {state['kind']}, or start "
                                    f"anew with --resume never (or another --out-dir)")
        for name, optimizer in self.parts.items():
            if not isinstance(state.get(name), dict):
                raise OptimizerMismatch(f"the checkpoint's optimizer state has no {name} part; resume from another "
                                        f"checkpoint, or start anew with --resume never")
            optimizer.load_state_dict(state[name])
