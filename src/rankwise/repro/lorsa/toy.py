"""The toy model of card R1: a 2-layer attention-only transformer (d = 64, 2 heads of 32, RoPE, pre-RMSNorm)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rankwise.core.training import fit
from rankwise.nn.lorsa import CausalSelfAttention, Rope


class AttentionOnly(nn.Module):
    """tokens [B, T] -> logits [B, T, vocab]; block l: h <- h + attn_l(norm_l(h))."""

    def __init__(self, vocab: int = 64, d: int = 64, heads: int = 2, head_dim: int = 32, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.norms = nn.ModuleList(nn.RMSNorm(d) for _ in range(layers))
        self.attns = nn.ModuleList(CausalSelfAttention(d, heads, head_dim, rope=Rope(head_dim, 1e4)) for _ in range(layers))
        self.final = nn.RMSNorm(d)
        self.unembed = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor, capture: int | None = None):
        """Logits, or with `capture = l` the pair (attention input after the pre-norm, attention output) of layer l."""
        h = self.embed(tokens)
        for i, (norm, attn) in enumerate(zip(self.norms, self.attns)):
            x = norm(h)
            y = attn(x)
            if capture == i:
                return x, y
            h = h + y
        return self.unembed(self.final(h))


def train_toy(tokens: torch.Tensor, labels: torch.Tensor, steps: int, batch: int, lr: float,
              seed: int) -> tuple[AttentionOnly, list[float]]:
    """Next-token training on `tokens` [N, T] with Adam (constant `lr`, no clipping, on `core.training.fit`);
    returns (model in eval mode, losses).

    The loss counts the positions where a planted mechanism fixes the next token (labels >= 0): the random filler
    carries no learnable signal and would only slow the forming of the mechanisms (about 500 steps this way).
    """
    torch.manual_seed(seed)
    model = AttentionOnly()
    gen = torch.Generator().manual_seed(seed)

    def loss_at(_: int) -> torch.Tensor:
        i = torch.randint(0, tokens.size(0), (batch,), generator=gen)
        b, keep = tokens[i], labels[i, :-1] >= 0
        return F.cross_entropy(model(b[:, :-1])[keep], b[:, 1:][keep])

    run = fit(model, loss_at, steps, lambda params: torch.optim.Adam(params, lr=lr), desc="toy transformer")
    return model.eval(), run.losses


@torch.no_grad()
def mechanism_accuracy(model: AttentionOnly, tokens: torch.Tensor, labels: torch.Tensor, n_mech: int) -> list[float]:
    """Next-token accuracy at the query positions of each planted mechanism."""
    pred = model(tokens[:, :-1]).argmax(-1)
    hit = pred == tokens[:, 1:]
    lab = labels[:, :-1]
    return [float(hit[lab == m].float().mean()) for m in range(n_mech)]


@torch.no_grad()
def capture_layer(model: AttentionOnly, tokens: torch.Tensor, layer: int, batch: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """(X, Y) of `layer` for tokens [N, T]: each [N, T, d]."""
    xs, ys = zip(*(model(tokens[i:i + batch], capture=layer) for i in range(0, tokens.size(0), batch)))
    return torch.cat(xs), torch.cat(ys)
