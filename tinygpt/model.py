"""TinyGPT: a character-level GPT that reads top to bottom.

    tokens (B, T) ─> token embedding + position embedding ─> n_layer × Block ─> LayerNorm ─> head ─> logits

    Block(x) = x + Attention(LayerNorm(x))          # pre-norm: the residual stream is never normalised,
             then x + MLP(LayerNorm(x))             # so gradients flow straight through the sum

The output head shares its weight with the token embedding ("weight tying"): the same matrix maps a
character to a vector and a vector back to a score per character.

The shape of the model is `tinygpt.base.config.ModelConfig` (n_layer, n_head, n_embd, block_size, dropout,
bias, pos_emb, causal), the one description of it that the command line, the launcher and checkpoints share;
the vocabulary size comes from the data.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

if TYPE_CHECKING:  # only for the annotations: the model needs nothing from the config module at run time
    from tinygpt.base.config import ModelConfig


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        # Without the mask (the exercise) position t also sees t+1, the very character it must predict: the
        # training loss falls far below what the model can do when it generates, where there is no future.
        self.causal = cfg.causal
        # One Linear produces queries, keys and values for every head at once: one big matmul is
        # faster than 3 * n_head small ones.
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def _heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 × (B, T, C)
        # (B, T, C) -> (B, nh, T, hs): heads become a batch dimension.
        return tuple(t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self._heads(x)
        # Fused attention (flash / memory-efficient kernels where the device has them): the (T, T)
        # weights below are never materialised. Dropout acts on the attention weights.
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=self.causal)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble the heads side by side
        return self.resid_dropout(self.proj(y))

    @torch.no_grad()
    def weights(self, x: torch.Tensor) -> torch.Tensor:
        """The attention weights, (B, nh, T, T), by an explicit softmax. Only for pictures."""
        q, k, _ = self._heads(x)
        T = x.size(1)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (B, nh, T, T)
        if self.causal:
            future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        return scores.softmax(dim=-1)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.gelu = nn.GELU()
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(self.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))  # tokens talk to each other
        x = x + self.mlp(self.ln2(x))  # each token thinks on its own
        return x


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int, checkpoint_blocks: bool = False):
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.tok_emb = nn.Embedding(vocab_size, cfg.n_embd)
        # Without position embeddings attention sees a bag of characters (only the causal mask tells
        # order apart): the classic exercise that shows why positions matter.
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd) if cfg.pos_emb else None
        self.emb_dropout = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.head = nn.Linear(cfg.n_embd, vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # weight tying

        # Activation checkpointing: keep only each block's input and recompute the block in backward,
        # trading about a third more compute for most of the activation memory.
        self.checkpoint_blocks = checkpoint_blocks

        self.apply(self._init_weights)
        # Each block adds two projections to the residual stream; scaling them by 1/sqrt(2 * n_layer)
        # keeps the stream's variance from growing with depth (GPT-2).
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters, counting the tied head once; without the embeddings by default (as for FLOPs)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.tok_emb.weight.numel()
            if self.pos_emb is not None:
                n -= self.pos_emb.weight.numel()
        return n

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        if T > self.cfg.block_size:
            raise ValueError(f"cannot forward a sequence of length {T}, block size is only {self.cfg.block_size}")
        x = self.tok_emb(idx)  # (B, T, C)
        if self.pos_emb is not None:
            x = x + self.pos_emb(torch.arange(T, device=idx.device))  # (T, C) broadcasts over B
        return self.emb_dropout(x)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """Logits (B, T, vocab) and, given targets (B, T), the mean cross-entropy loss."""
        x = self.embed(idx)
        for block in self.blocks:
            if self.checkpoint_blocks and torch.is_grad_enabled():
                # The saved RNG state makes the recomputed dropout masks identical to the first pass.
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.head(self.ln_f(x))  # (B, T, vocab)
        if targets is None:
            return logits, None
        # The loss in fp32 even under autocast: a softmax over the vocabulary in bf16 loses digits.
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))
        return logits, loss

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Append `max_new_tokens` sampled ids to `idx` (B, T); returns (B, T + max_new_tokens)."""
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        for _ in range(max_new_tokens):
            context = idx[:, -self.cfg.block_size :]  # the model has never seen more than block_size
            logits, _ = self(context)
            logits = logits[:, -1, :].float() / temperature  # only the last position predicts the next
            if top_k is not None and top_k < logits.size(-1):
                kth = torch.topk(logits, top_k).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = logits.softmax(dim=-1)
            next_id = torch.multinomial(probs, 1, generator=generator)  # (B, 1)
            idx = torch.cat([idx, next_id], dim=1)
        return idx

    @torch.no_grad()
    def attention_maps(self, idx: torch.Tensor, layer: int = 0) -> torch.Tensor:
        """Attention weights of every head of `layer` for one prompt (T,) or (1, T): (n_head, T, T)."""
        if not 0 <= layer < self.cfg.n_layer:
            raise ValueError(f"layer must be in 0..{self.cfg.n_layer - 1}, got {layer}")
        if idx.dim() == 1:
            idx = idx[None]
        was_training = self.training
        self.eval()
        try:
            x = self.embed(idx)
            for block in self.blocks[:layer]:
                x = block(x)
            return self.blocks[layer].attn.weights(self.blocks[layer].ln1(x))[0]
        finally:
            self.train(was_training)
