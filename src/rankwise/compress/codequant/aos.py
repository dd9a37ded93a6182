"""Stage 1, the learning half: activation outlier smoothing (AOS).

One orthogonal R [d, d], Cayley-parametrised (torch's `parametrizations.orthogonal(..., orthogonal_map="cayley")`),
minimises the activation-quantization error of the rotated stream summed over every norm output:

    min_R  sum_hooks MSE(X R, Q_a(X R))

X: detached activations of the FP model (norms folded, not rotated), captured once (`norm_outputs`). Q_a is the
per-token asymmetric min-max quantizer (`act_quant.fake_quant`); its rounding has zero gradient, so R learns through
the scale/min path and the first argument only, as in the paper. Adam on the Cayley parameter, model frozen.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from rankwise.compress.codequant.act_quant import check_bits, fake_quant
from rankwise.compress.codequant.structure import Decoder
from rankwise.errors import InvalidInputError, NumericalError


@torch.no_grad()
def norm_outputs(model: nn.Module, decoder: Decoder, windows: torch.Tensor, max_tokens: int, seed: int = 0,
                 batch_size: int = 8) -> list[torch.Tensor]:
    """The outputs of every input_layernorm and post_attention_layernorm on `windows [W, T]` token ids, a random
    subset of `max_tokens` token positions (the same for every hook), each [max_tokens, d] fp32."""
    if windows.dim() != 2 or windows.numel() == 0:
        raise InvalidInputError(f"calibration windows must be a non-empty [W, T] tensor, got {tuple(windows.shape)}")
    norms = [n for b in decoder.blocks for n in (b.input_norm, b.post_norm)]
    caught: list[list[torch.Tensor]] = [[] for _ in norms]
    hooks = [n.register_forward_hook(lambda _m, _i, out, k=k: caught[k].append(out.detach().flatten(0, -2).float()))
             for k, n in enumerate(norms)]
    try:
        for start in range(0, windows.size(0), batch_size):
            model(windows[start:start + batch_size])
    finally:
        for h in hooks:
            h.remove()
    total = windows.numel()
    pick = torch.randperm(total, generator=torch.Generator().manual_seed(seed))[: min(max_tokens, total)]
    return [torch.cat(c)[pick] for c in caught]


def aos_loss(r: torch.Tensor, activations: list[torch.Tensor], bits: int, group: int | None = None) -> torch.Tensor:
    """sum over hooks of MSE(X R, Q_a(X R)) for activations [N, d] each; a scalar tensor (differentiable in R)."""
    total = r.new_zeros(())
    for x in activations:
        xr = x @ r
        total = total + nn.functional.mse_loss(xr, fake_quant(xr, bits, group))
    return total


@dataclass(frozen=True)
class AOSConfig:
    steps: int = 200
    lr: float = 1e-3
    batch_tokens: int = 256  # tokens per hook per step
    bits: int = 4
    group: int | None = None  # activation group (None: the whole token, the paper's embedding-wise setting)

    def __post_init__(self) -> None:
        check_bits(self.bits)
        for name in ("steps", "batch_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidInputError(f"AOS {name} must be a positive integer, got {v!r}")
        if not self.lr > 0:
            raise InvalidInputError(f"AOS lr must be positive, got {self.lr!r}")


@dataclass
class AOSResult:
    rotation: torch.Tensor  # [d, d] fp32, orthogonal
    losses: list[float] = field(default_factory=list)  # the training objective per step (its minibatch)
    initial_loss: float = float("nan")  # on the full activations given, at R0
    final_loss: float = float("nan")


def learn_rotation(activations: list[torch.Tensor], init: torch.Tensor, config: AOSConfig, seed: int = 0) -> AOSResult:
    """Train R from `init` [d, d] (orthogonal; the paper starts from a random orthogonal matrix) on activations
    [N, d] per hook with Adam; returns the rotation, orthogonal to fp32 rounding by construction of the Cayley map."""
    if not activations:
        raise InvalidInputError("AOS needs at least one hook's activations")
    d = init.shape[0]
    if any(x.dim() != 2 or x.shape[1] != d for x in activations):
        raise InvalidInputError(f"every hook's activations must be [N, {d}]")
    if not all(torch.isfinite(x).all() for x in activations):
        raise NumericalError("calibration activations contain NaN or infinity")
    holder = nn.Linear(d, d, bias=False)
    nn.utils.parametrizations.orthogonal(holder, orthogonal_map="cayley")
    with torch.no_grad():
        holder.weight = init.float()  # right_inverse: the trivialisation starts at R0
    opt = torch.optim.Adam(holder.parameters(), lr=config.lr)
    g = torch.Generator().manual_seed(seed)
    result = AOSResult(rotation=init.float().clone())
    with torch.no_grad():
        result.initial_loss = float(aos_loss(holder.weight, activations, config.bits, config.group))
    for _ in range(config.steps):
        batch = [x[torch.randint(0, x.shape[0], (config.batch_tokens,), generator=g)] for x in activations]
        loss = aos_loss(holder.weight, batch, config.bits, config.group)
        if not torch.isfinite(loss):
            raise NumericalError("the AOS objective became non-finite")
        opt.zero_grad()
        loss.backward()
        opt.step()
        result.losses.append(float(loss.detach()))
    with torch.no_grad():
        r = holder.weight.detach().clone()
        result.final_loss = float(aos_loss(r, activations, config.bits, config.group))
    result.rotation = r
    return result
