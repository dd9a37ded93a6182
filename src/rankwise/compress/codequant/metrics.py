"""What a quantized decoder is compared on besides perplexity: router agreement with the FP model (the top-k expert
set of every token at every MoE layer) and each quantized module's relative output error.

Both run the FP and the quantized model on the same windows and match modules by position (layer index and role),
so they work across a swap of nn.Linear for RoundedLinear / ClusteredLinear.
"""

from __future__ import annotations

import torch
from torch import nn

from rankwise.compress.codequant.structure import decoder_of
from rankwise.errors import InvalidInputError


def _outputs(model: nn.Module, modules: dict[str, nn.Module], windows: torch.Tensor, batch_size: int
             ) -> dict[str, list[torch.Tensor]]:
    caught: dict[str, list[torch.Tensor]] = {k: [] for k in modules}
    handles = [m.register_forward_hook(lambda _m, _a, y, k=k: caught[k].append(y.detach().flatten(0, -2).float()))
               for k, m in modules.items()]
    try:
        with torch.no_grad():
            for start in range(0, windows.size(0), batch_size):
                model(windows[start:start + batch_size])
    finally:
        for h in handles:
            h.remove()
    return caught


def _routers(model: nn.Module) -> dict[str, nn.Module]:
    return {f"layers.{b.index}": b.router for b in decoder_of(model).blocks if b.router is not None}


def router_agreement(fp_model: nn.Module, model: nn.Module, windows: torch.Tensor, top_k: int,
                     batch_size: int = 8) -> float:
    """Share of (token, MoE layer) pairs whose set of top-k experts is the same in both models, in [0, 1]."""
    fp_routers, routers = _routers(fp_model), _routers(model)
    if not fp_routers:
        raise InvalidInputError("router agreement needs a mixture-of-experts model (a router mlp.gate)")
    a, b = _outputs(fp_model, fp_routers, windows, batch_size), _outputs(model, routers, windows, batch_size)
    same = total = 0
    for k in fp_routers:
        ta = torch.cat(a[k]).topk(top_k, -1).indices.sort(-1).values
        tb = torch.cat(b[k]).topk(top_k, -1).indices.sort(-1).values
        same += int((ta == tb).all(-1).sum())
        total += ta.shape[0]
    return same / total


def _scoped(model: nn.Module) -> dict[str, nn.Module]:
    out: dict[str, nn.Module] = {}
    for b in decoder_of(model).blocks:
        for tag, m in zip(("q_proj", "k_proj", "v_proj"), b.attention_readers):
            out[f"layers.{b.index}.{tag}"] = m
        out[f"layers.{b.index}.mlp"] = b.mlp
    return out


def relative_output_errors(fp_model: nn.Module, model: nn.Module, windows: torch.Tensor,
                           batch_size: int = 8) -> dict[str, float]:
    """‖Y_q - Y_fp‖² / ‖Y_fp‖² of every q/k/v projection and MLP block (errors accumulated through the network)."""
    fp_mods, mods = _scoped(fp_model), _scoped(model)
    a, b = _outputs(fp_model, fp_mods, windows, batch_size), _outputs(model, mods, windows, batch_size)
    result = {}
    for k in fp_mods:
        ya, yb = torch.cat(a[k]).double(), torch.cat(b[k]).double()
        result[k] = float(((yb - ya) ** 2).sum() / (ya**2).sum().clamp_min(1e-30))
    return result
