"""C. Model-level fidelity at the operating points: per-sentence MiniLM embedding cosine and per-window SmolLM2 NLL,
so the claims pair block sizes or formats sentence by sentence / window by window (bootstrap over the text)."""

from __future__ import annotations

import torch
from torch import nn

from rankwise.eval import logits_of
from rankwise.quant.block import BlockRecipe
from rankwise.quant.fake_quant import fake_quantize, quantizable_linears
from rankwise.repro.microscaling_ue5m3.regimes import regime_alphas


@torch.no_grad()
def quantize_at_regime_(model: nn.Module, recipe: BlockRecipe, regime: str, exclude: tuple[str, ...]) -> None:
    """Fake-quantize every nn.Linear weight in place as Q(alpha_t W_t) / alpha_t, alpha_t from `regime`."""
    layers = quantizable_linears(model, exclude)
    alphas = regime_alphas([(n, m.weight.detach()) for n, m in layers], regime)
    for n, m in layers:
        w = m.weight
        w.copy_((fake_quantize(w.float() * alphas[n], recipe) / alphas[n]).to(w.dtype))


@torch.no_grad()
def window_nlls(model: nn.Module, windows: torch.Tensor, batch_size: int = 4) -> list[float]:
    """Mean next-token NLL of each window [W, T] -> W floats (float64 sums); exp(mean) is the perplexity."""
    model.eval()
    out: list[float] = []
    for start in range(0, windows.size(0), batch_size):
        batch = windows[start : start + batch_size]
        logits = logits_of(model, batch)[:, :-1].float()
        nll = nn.functional.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none")  # [B, T-1]
        out += nll.double().mean(-1).tolist()
    return out


def restore_(model: nn.Module, original: dict[str, torch.Tensor]) -> None:
    for n, p in model.named_parameters():
        p.data.copy_(original[n])
