"""The optimizers a run trains with: AdamW, or Muon for the blocks' matrices with AdamW for the rest.

`optimizer: adamw` (the default): AdamW for every parameter, weight decay on matrices (`weight_decay_on`).
`optimizer: muon`: PyTorch's own `torch.optim.Muon` (torch 2.9 and later) for the 2-D weight matrices inside
the blocks (attention's qkv and output projections, the MLP's two layers), and AdamW for the rest: the token
and position embeddings (the output head is tied to the token embedding), LayerNorm gains and biases. This is
the split of Muon's authors and of modded-nanogpt: orthogonalising an update suits a hidden linear map, not a
table of rows looked up (embeddings) nor the classifier that reads them out, and a 1-D parameter has no
matrix to orthogonalise. Each part has its own peak rate (`lr`, `muon_lr`); one schedule scales both.

Both parts are stepped together and checkpointed as one part of a checkpoint, `Optimizers`.
"""

from __future__ import annotations

from typing import Any

import torch

from tinygpt.base.config import OptimConfig
from tinygpt.model import GPT


class OptimizerMismatch(ValueError):
    """A checkpoint's optimizer state is not of the optimizer this run asks for."""


def muon_parameters(model: GPT) -> set[str]:
    """The names of the parameters Muon trains: the 2-D weights inside the blocks."""
    return {name for name, p in model.named_parameters() if p.requires_grad and p.dim() == 2
            and name.startswith("blocks.")}


class Optimizers:
    """AdamW alone, or Muon and AdamW side by side: what the trainer steps, schedules and checkpoints."""

    def __init__(self, model: GPT, cfg: OptimConfig, fused: bool):
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
            self.parts["muon"] = torch.optim.Muon([p for n, p in named if n in to_muon], lr=cfg.muon_lr,
                                                  momentum=cfg.muon_momentum, weight_decay=cfg.muon_weight_decay)

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
