"""Calibration statistics of each linear's inputs, accumulated batch by batch (nothing [N, d] is kept):
XᵀX in float64 (GPTQ's Hessian) and the per-channel max |x| (SmoothQuant), over the tokens each linear actually
sees (an expert sees only the tokens routed to it)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from rankwise.errors import InvalidInputError, NumericalError


@dataclass
class InputStats:
    gram: torch.Tensor  # [in, in] float64, sum of x xᵀ
    absmax: torch.Tensor  # [in] float64
    tokens: int = 0

    def hessian(self) -> torch.Tensor:
        """2 XᵀX / N (zeros for a linear that saw no token, which GPTQ treats as dead inputs)."""
        return 2.0 * self.gram / max(self.tokens, 1)


@torch.no_grad()
def collect_input_stats(model: nn.Module, linears: dict[str, nn.Module], windows: torch.Tensor,
                        batch_size: int = 8) -> dict[str, InputStats]:
    """Run `windows [W, T]` through `model` and accumulate the input statistics of each named linear."""
    if windows.dim() != 2 or windows.numel() == 0:
        raise InvalidInputError(f"calibration windows must be a non-empty [W, T] tensor, got {tuple(windows.shape)}")
    stats: dict[str, InputStats] = {}

    def hook(name: str):
        def record(module: nn.Module, args: tuple) -> None:
            x = args[0].detach().reshape(-1, args[0].shape[-1]).double()
            if not torch.isfinite(x).all():
                raise NumericalError(f"the inputs of {name} contain NaN or infinity")
            s = stats.setdefault(name, InputStats(torch.zeros(x.shape[1], x.shape[1], dtype=torch.float64),
                                                  torch.zeros(x.shape[1], dtype=torch.float64)))
            s.gram += x.T @ x
            if x.shape[0]:
                s.absmax = torch.maximum(s.absmax, x.abs().amax(0))
            s.tokens += x.shape[0]
        return record

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in linears.items()]
    try:
        for start in range(0, windows.size(0), batch_size):
            model(windows[start:start + batch_size])
    finally:
        for h in handles:
            h.remove()
    for name, m in linears.items():  # a linear no token reached (an unused expert) still gets empty statistics
        if name not in stats:
            d = m.weight.shape[1]
            stats[name] = InputStats(torch.zeros(d, d, dtype=torch.float64), torch.zeros(d, dtype=torch.float64))
    return stats
