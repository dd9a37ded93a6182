"""Differentially private gradients of a few named tensors: per-sample gradients (`torch.func`), per-sample
clipping, Gaussian noise, and the privacy accountant (Opacus' RDP accountant).

The DP-SGD step (Abadi et al. 2016) on the tensors `names` of a batch of b samples:

    g_j   = grad of loss(sample j) w.r.t. the tensors          (per sample, `per_sample_gradients`)
    g_j  <- g_j * min(1, C / ||g_j||)  (one norm over all the tensors together, `clip_per_sample`)
    g~    = (sum_j g_j + N(0, sigma^2 C^2 I)) / b_expected      (`noisy_mean`)

With Poisson sampling (each example joins a step's batch independently with probability q = b / n) the Gaussian
mechanism's Renyi-DP composes over steps and `epsilon_spent` is a real (epsilon, delta) guarantee per example;
`noise_for_epsilon` inverts it for a target epsilon (Opacus' `get_noise_multiplier`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import lru_cache

import torch
from torch.func import grad_and_value, vmap

from rankwise.errors import InvalidInputError

Tensors = dict[str, torch.Tensor]
# The RDP orders the accountant minimises over. Opacus' default has ~150 orders, ~100 of them fractional (a slow series:
# seconds per epsilon, and a job computes one per client). Any set of orders gives a valid bound (a smaller set can
# only make it looser); these span the optima of epsilon ~0.5..20 at delta 1e-5 to 1e-3 (two fractional ones).
RDP_ORDERS = (1.5, 2, 2.5, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64)
# loss(params, sample) -> scalar: `sample` holds one example (each tensor without its batch dimension)
SampleLoss = Callable[[Mapping[str, torch.Tensor], Mapping[str, torch.Tensor]], torch.Tensor]


def per_sample_gradients(loss: SampleLoss, params: Mapping[str, torch.Tensor], batch: Mapping[str, torch.Tensor],
                         chunk_size: int | None = None) -> tuple[Tensors, torch.Tensor]:
    """Gradient of `loss` for every sample of `batch` (tensors [b, ...]) w.r.t. `params`: ({name: [b, *shape]},
    the per-sample losses [b])."""
    b = _batch_size(batch)
    if b == 0:
        return {n: p.new_zeros((0, *p.shape)) for n, p in params.items()}, torch.zeros(0)
    fn = vmap(grad_and_value(loss), in_dims=(None, 0), chunk_size=chunk_size)
    grads, losses = fn({n: p.detach() for n, p in params.items()}, dict(batch))
    return grads, losses.detach()


def clip_per_sample(grads: Mapping[str, torch.Tensor], clip: float) -> tuple[Tensors, torch.Tensor]:
    """Scale each sample's gradient (all tensors together) to l2 norm <= clip. Returns (clipped, norms before [b]).

    `clip = inf` leaves them unchanged. The factor min(1, C / (norm + 1e-6)) is Opacus' (the 1e-6 keeps a zero
    gradient finite and puts the clipped norm strictly below C)."""
    if not clip > 0:
        raise InvalidInputError(f"the clipping norm C must be positive, got {clip}")
    flat = [g.reshape(g.size(0), math.prod(g.shape[1:])) for g in grads.values()]  # (an empty batch too)
    norms = torch.linalg.vector_norm(torch.cat(flat, dim=1), dim=1) if flat else torch.zeros(0)
    if math.isinf(clip):
        return dict(grads), norms
    factor = (clip / (norms + 1e-6)).clamp(max=1.0)
    return {n: g * factor.view(-1, *([1] * (g.dim() - 1))) for n, g in grads.items()}, norms


def noisy_mean(clipped: Mapping[str, torch.Tensor], clip: float, noise_multiplier: float, expected_batch: float,
               generator: torch.Generator) -> Tensors:
    """(sum of per-sample gradients + N(0, (sigma C)^2)) / expected batch size, per tensor: {name: shape}.

    Divided by the *expected* batch size (not the drawn one): the drawn size depends on the data, and dividing by it
    would leak what the sum hides (Opacus does the same)."""
    if noise_multiplier < 0 or not math.isfinite(noise_multiplier):
        raise InvalidInputError(f"the noise multiplier must be a finite number >= 0, got {noise_multiplier}")
    if noise_multiplier > 0 and math.isinf(clip):
        raise InvalidInputError("noise needs a finite clipping norm C (the noise std is sigma * C)")
    out: Tensors = {}
    for n, g in clipped.items():
        total = g.sum(0)
        if noise_multiplier > 0:
            total = total + noise_multiplier * clip * torch.randn(total.shape, generator=generator, dtype=total.dtype)
        out[n] = total / expected_batch
    return out


def noise_for_epsilon(epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """The noise multiplier sigma for which `steps` Poisson-sampled Gaussian steps at rate q spend at most
    (epsilon, delta) (Opacus' RDP accountant, binary search to 0.01 in epsilon). Raises InvalidInputError when no
    sigma reaches the target (epsilon below what the RDP-to-DP conversion can give at this delta)."""
    check_budget(epsilon, delta)
    _check_rate(sample_rate, steps)
    try:
        return _noise_for_epsilon(float(epsilon), float(delta), float(sample_rate), int(steps))
    except ValueError as e:
        raise InvalidInputError(f"a privacy budget of epsilon={epsilon:g} at delta={delta:g} cannot be reached with {steps} "
                                f"steps at sampling rate {sample_rate:.4g} (Opacus: {e}); raise epsilon or delta, or take fewer "
                                "steps") from None


def epsilon_spent(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    """The epsilon (at `delta`) of `steps` Poisson-sampled Gaussian steps with this sigma and rate (RDP accountant)."""
    if steps == 0:
        return 0.0
    _check_rate(sample_rate, steps)
    if noise_multiplier <= 0:
        return math.inf
    return _epsilon_spent(float(noise_multiplier), float(sample_rate), int(steps), float(delta))


@lru_cache(maxsize=4096)
def _noise_for_epsilon(epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    from opacus.accountants.utils import get_noise_multiplier

    return float(get_noise_multiplier(target_epsilon=epsilon, target_delta=delta, sample_rate=sample_rate, steps=steps,
                                      accountant="rdp", alphas=list(RDP_ORDERS)))


@lru_cache(maxsize=4096)
def _epsilon_spent(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = [(noise_multiplier, sample_rate, steps)]
    return float(accountant.get_epsilon(delta=delta, alphas=list(RDP_ORDERS)))


def check_budget(epsilon: float, delta: float) -> None:
    if not (isinstance(epsilon, (int, float)) and epsilon > 0 and math.isfinite(epsilon)):
        raise InvalidInputError(f"epsilon must be a positive finite number, got {epsilon!r}")
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise InvalidInputError(f"delta must lie in (0, 1), got {delta!r}")


def _check_rate(sample_rate: float, steps: int) -> None:
    if not 0 < sample_rate <= 1:
        raise InvalidInputError(f"the sampling rate (batch / client examples) must lie in (0, 1], got {sample_rate}")
    if not isinstance(steps, int) or steps < 1:
        raise InvalidInputError(f"the number of noisy steps must be a positive integer, got {steps!r}")


def _batch_size(batch: Mapping[str, torch.Tensor]) -> int:
    sizes = {t.size(0) for t in batch.values()}
    if len(sizes) != 1:
        raise InvalidInputError(f"every tensor of a batch needs the same first (batch) dimension, got sizes {sorted(sizes)}")
    return sizes.pop()
