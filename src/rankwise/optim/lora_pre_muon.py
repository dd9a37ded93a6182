"""LoRA-Pre (Muon): Muon whose momentum is kept as low-rank factors for 2-D parameters.

Paper: "Taming Momentum: Rethinking Optimizer States Through Low-Rank Approximation" (Wang et al., ICLR 2026),
the Muon variant (the method card's "LoRA-Pre (Muon)"). For a 2-D parameter W [p, q] with gradient g the state is
m_B [p, r] and m_A [r, q] ((p + q) r floats instead of Muon's p q). Each step:
    1. m_prev = m_B m_A, from the factors before this step's regression (`use_updated_factors=False`, the default,
       as in LoRAPre) or after it (True);
    2. one Newton step of (m_B, m_A) towards g / (1 - mu) with gamma = 1 - sqrt(mu): each factor decays by sqrt(mu),
       so the product forgets at mu per step and settles where Muon's un-normalised momentum does, at g / (1 - mu);
    3. m = mu m_prev + g;  O = newton_schulz5(m);  W <- W - lr (O max(1, p/q)^0.5 + weight_decay W).
Parameters that are not 2-D, and every parameter of a group with `rank=None`, get plain AdamW, bit-identical to
`torch.optim.AdamW(foreach=False)` (LoRAPre's dense path), with the group's lr, betas, eps and weight_decay.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from rankwise.errors import InvalidInputError
from rankwise.optim.lora_pre import LoRAPre, check_adamw_rates, check_group_rank
from rankwise.optim.low_rank_regression import DEFAULT_RIDGE, gamma_for_beta, newton_factor_step_, newton_factor_steps_
from rankwise.optim.newton_schulz import newton_schulz5

MUON_FACTOR_KEYS = ("m_B", "m_A")


def muon_shape_scale(rows: int, cols: int) -> float:
    """max(1, rows/cols)^0.5: the usual Muon scale for a [rows, cols] update (the card gives none).

    An orthogonalised [rows, cols] matrix has RMS entry 1/sqrt(max(rows, cols)); the scale lifts tall matrices
    (more outputs than inputs) to the RMS of a square one, so their per-entry step does not shrink with height."""
    return max(1.0, rows / cols) ** 0.5


class LoRAPreMuon(LoRAPre):
    """Muon with a rank-`rank` factored momentum for 2-D parameters; AdamW for the rest.

    Args:
        params: parameters or param groups (e.g. `low_rank_param_groups(model, rank)`). A group may set its own
            `rank` (None: plain AdamW for the whole group) and any hyperparameter below. The AdamW path uses the
            group's `lr`: Muon's lr (0.02) is far too large for AdamW, so give the dense group its own, e.g.
            `groups[1]["lr"] = 3e-4` (a per-group lr, so learning-rate schedulers scale it too).
        lr: learning rate (Muon's usual 0.02 by default).
        momentum: mu in m = mu m_prev + g, in [0, 1).
        weight_decay: decoupled: W <- W - lr weight_decay W, for both paths.
        rank: rank r of the momentum factors; must not exceed min(p, q) of any 2-D parameter it applies to.
        betas, eps: AdamW's, for the parameters on the AdamW path only.
        nesterov: orthogonalise g + mu m instead of m (Muon's usual option; not part of the card, so off).
        ns_steps: Newton-Schulz iterations.
        ridge, init_std, use_updated_factors, nonfinite, seed: as in LoRAPre.
    """

    factor_keys = MUON_FACTOR_KEYS
    legacy_group_defaults: dict[str, Any] = {}

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 0.02,
        momentum: float = 0.95,
        weight_decay: float = 0.0,
        rank: int | None = 8,
        *,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        nesterov: bool = False,
        ns_steps: int = 5,
        ridge: float = DEFAULT_RIDGE,
        init_std: float = 0.02,
        use_updated_factors: bool = False,
        nonfinite: str = "raise",
        seed: int = 0,
    ) -> None:
        defaults = dict(
            lr=lr, momentum=momentum, weight_decay=weight_decay, rank=rank, betas=tuple(betas), eps=eps,
            nesterov=nesterov, ns_steps=ns_steps, ridge=ridge, init_std=init_std, use_updated_factors=use_updated_factors,
        )
        self._setup(params, defaults, nonfinite, seed)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_adamw_rates(group)  # betas/eps for the AdamW path, and non-negative lr, weight_decay, ridge
        if not 0.0 <= group["momentum"] < 1.0:  # the regression target g / (1 - mu) needs mu < 1
            raise InvalidInputError(f"momentum must lie in [0, 1), got {group['momentum']}")
        if isinstance(group["ns_steps"], bool) or not isinstance(group["ns_steps"], int) or group["ns_steps"] < 1:
            raise InvalidInputError(f"ns_steps must be a positive int, got {group['ns_steps']!r}")
        check_group_rank(group)

    def _factored_step(self, p: torch.Tensor, group: dict[str, Any], index: int) -> None:
        state = self.state[p]
        if not state:
            state.update(self._initial_factors(p, group, index))
        mu, lr, wd = group["momentum"], group["lr"], group["weight_decay"]
        # Factors and momentum in float32 at least, even for bf16 weights (the Gram solves need it).
        g = p.grad.float() if p.dtype in (torch.float16, torch.bfloat16) else p.grad
        m_b, m_a = state["m_B"], state["m_A"]
        state["step"] += 1
        if not group["use_updated_factors"]:
            m_prev = m_b @ m_a
        # Muon's momentum m = mu m + g settles at g / (1 - mu) for a constant g: regress the factors on that, with
        # per-factor decay sqrt(mu) so that their product forgets at mu per step, as m does.
        newton_factor_step_(m_b, m_a, g / (1.0 - mu), gamma_for_beta(mu, 2), group["ridge"])
        if group["use_updated_factors"]:
            m_prev = m_b @ m_a
        momentum = m_prev.mul_(mu).add_(g)
        direction = g.add(momentum, alpha=mu) if group["nesterov"] else momentum
        update = newton_schulz5(direction, group["ns_steps"])
        if wd != 0:
            p.mul_(1 - lr * wd)
        p.add_(update.to(p.dtype), alpha=-lr * muon_shape_scale(*p.shape))

    def _factored_bucket_step(self, params: list[torch.Tensor], group: dict[str, Any]) -> None:
        """`_factored_step` for n same-shape parameters with existing states, batched: the factor regression's
        r x r solves and updates run stacked (`newton_factor_steps_`), the target g / (1 - mu) is never formed (the
        Newton step is linear in it), and m = mu m_B m_A + g is one addmm per matrix. The [p, q] work runs matrix
        by matrix (see LoRAPre._factored_bucket_step); Newton-Schulz, ~5 x 6 min(p,q)^2 max(p,q) flops of large
        matmuls per matrix, is what batching cannot make cheaper on a CPU. Equal to `_factored_step` up to float
        rounding."""
        states = [self.state[p] for p in params]
        mu, lr, wd = group["momentum"], group["lr"], group["weight_decay"]
        low = params[0].dtype in (torch.float16, torch.bfloat16)
        grads = [p.grad.float() for p in params] if low else [p.grad for p in params]
        old = [torch.stack([s[k] for s in states]) for k in MUON_FACTOR_KEYS]
        new = [f.clone() for f in old]
        torch._foreach_add_([s["step"] for s in states], 1.0)
        newton_factor_steps_(new[0], new[1], grads, gamma_for_beta(mu, 2), group["ridge"], target_scale=1.0 / (1.0 - mu))
        for k, stacked in zip(MUON_FACTOR_KEYS, new):
            torch._foreach_copy_([s[k] for s in states], list(stacked.unbind(0)))
        m_b, m_a = new if group["use_updated_factors"] else old
        alpha = -lr * muon_shape_scale(*params[0].shape)
        for i, (p, g) in enumerate(zip(params, grads)):
            momentum = torch.addmm(g, m_b[i], m_a[i], alpha=mu)
            direction = g.add(momentum, alpha=mu) if group["nesterov"] else momentum
            update = newton_schulz5(direction, group["ns_steps"])
            if wd != 0:
                p.mul_(1 - lr * wd)
            p.add_(update.to(p.dtype), alpha=alpha)

    @torch.no_grad()
    def low_rank_momentum(self, p: torch.Tensor) -> torch.Tensor:
        """The rank-r momentum surrogate m_B m_A [p, q] of a factored parameter, which the next step blends (times
        mu) with its gradient."""
        state = self.state.get(p)
        if not state or "m_B" not in state:
            raise InvalidInputError("this parameter has no low-rank state (not factored, or no step taken yet)")
        return state["m_B"] @ state["m_A"]

    def low_rank_moments(self, p: torch.Tensor) -> tuple[torch.Tensor]:  # type: ignore[override]
        """(m_B m_A,): Muon keeps a first moment only (see `low_rank_momentum`)."""
        return (self.low_rank_momentum(p),)
