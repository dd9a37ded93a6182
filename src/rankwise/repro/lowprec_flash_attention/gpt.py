"""Experiment (B)'s model and run: a small byte-level GPT whose attention is the tiled flash kernel (exact fp32, or
emulated bf16 with or without the fix), everything else fp32; trained with the one loop `core.training.fit`,
tracking the layer-2 spectral norms of W_Q and W_K (per head, the max) the paper links to the failure."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from rankwise.core.training import fit
from rankwise.nn.lowprec_flash_attention import FlashAttention, FlashConfig


@dataclass(frozen=True)
class GPTShape:
    vocab: int = 257
    d_model: int = 64
    heads: int = 4
    layers: int = 2
    seq_len: int = 64


class Block(nn.Module):
    def __init__(self, s: GPTShape, cfg: FlashConfig) -> None:
        super().__init__()
        self.heads, self.hd = s.heads, s.d_model // s.heads
        self.ln1, self.ln2 = nn.LayerNorm(s.d_model), nn.LayerNorm(s.d_model)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(s.d_model, s.d_model, bias=False) for _ in range(4))
        self.attn = FlashAttention(self.hd, s.heads, config=cfg)
        self.mlp = nn.Sequential(nn.Linear(s.d_model, 4 * s.d_model, bias=False), nn.GELU(),
                                 nn.Linear(4 * s.d_model, s.d_model, bias=False))

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.hd).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        a = self.attn(self._split(self.wq(h)), self._split(self.wk(h)), self._split(self.wv(h)))
        x = x + self.wo(a.transpose(1, 2).reshape(x.shape))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Byte-level decoder: tokens [B, T] -> logits [B, T, vocab]."""

    def __init__(self, s: GPTShape, cfg: FlashConfig) -> None:
        super().__init__()
        self.emb, self.pos = nn.Embedding(s.vocab, s.d_model), nn.Parameter(0.02 * torch.randn(s.seq_len, s.d_model))
        self.blocks = nn.ModuleList(Block(s, cfg) for _ in range(s.layers))
        self.ln, self.head = nn.LayerNorm(s.d_model), nn.Linear(s.d_model, s.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens) + self.pos[: tokens.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def head_spectral_norms(w: torch.Tensor, heads: int) -> list[float]:
    """‖W_h‖₂ of each head's rows of a [d_model, d_model] projection."""
    return [float(torch.linalg.matrix_norm(h.double(), 2)) for h in w.detach().chunk(heads, 0)]


@dataclass
class GPTRun:
    losses: list[float]
    wq_norms: list[float]  # per logged step: max over heads of layer 2's ‖W_Q^h‖₂
    wk_norms: list[float]
    eval_loss: float
    diverged: str | None = None
    steps_logged: list[int] = field(default_factory=list)


def train_gpt(arm: dict, shape: GPTShape, train: torch.Tensor, val: torch.Tensor, steps: int, batch: int, lr: float,
              seed: int, log_every: int) -> GPTRun:
    """One run: same init and batch order for every arm of a seed; AdamW, constant lr, clip 1.0, no warmup."""
    torch.manual_seed(seed)
    cfg = FlashConfig(causal=True, tile_q=32, tile_k=32, **arm)
    model = TinyGPT(shape, cfg)
    last = model.blocks[-1]
    wq, wk, logged = [], [], []

    def log(step: int) -> None:
        if step % log_every == 0 or step == steps - 1:
            wq.append(max(head_spectral_norms(last.wq.weight, shape.heads)))
            wk.append(max(head_spectral_norms(last.wk.weight, shape.heads)))
            logged.append(step + 1)

    def loss_at(step: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        idx = torch.randint(0, train.shape[0], (batch,), generator=g)
        x = train[idx]
        return nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())

    wq.append(max(head_spectral_norms(last.wq.weight, shape.heads)))
    wk.append(max(head_spectral_norms(last.wk.weight, shape.heads)))
    logged.append(0)
    res = fit(model, loss_at, steps, lambda p: torch.optim.AdamW(p, lr=lr, weight_decay=0.0), max_grad_norm=1.0,
              after_step=log, on_nonfinite="stop")
    with torch.no_grad():
        ev = nn.functional.cross_entropy(model(val[:, :-1]).flatten(0, 1), val[:, 1:].flatten())
    return GPTRun(res.losses, wq, wk, float(ev) if math.isfinite(float(ev)) else float("nan"), res.diverged, logged)


__all__ = ["GPTShape", "TinyGPT", "GPTRun", "train_gpt", "head_spectral_norms"]
