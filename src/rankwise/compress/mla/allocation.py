"""How many latent dimensions each layer gets: uniform, or CARE's adjusted ("water-filling") allocation.

Adjusted allocation shares the uniform budget `L * r_mean` of one matrix kind (K, V, or the joint KV latent)
across the L layers. Every layer starts at `min_rank`; one rank at a time goes to the layer with the highest score
for its next component, never past `max_rank` (nor the matrix's width). Ties go to the lowest layer index.

Scores, for a layer holding r ranks with whitened singular values sigma_1 >= sigma_2 >= ...:
  paper  s(r) = sigma_{r+1}^2 / sum_{m>r} sigma_m^2, the fraction of the remaining whitened residual (App. C: the
         residual equals the tail energy) that the next component removes. Note this favours layers whose
         residual sits in a few directions, whatever the paper's prose says; we implement the formula.
  code   the authors' released code: s(r) * h_l / sqrt(r / min_rank), with the "propagation horizon"
         h_l = sqrt((L - l) / ((L + 1) / 2)) (l 0-indexed) favouring early layers and a rank-cost penalty.
K and V are allocated separately, each from its own spectra.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from rankwise.errors import InvalidInputError, NumericalError, UnknownNameError

ALLOCATIONS = ("uniform", "adjusted")
SCORES = ("paper", "code")


def greedy_rank_allocation(
    num_items: int,
    budget: int,
    priority: Callable[[int, int], float],
    min_rank: int | Sequence[int],
    max_rank: int | Sequence[int],
) -> list[int]:
    """Water-filling: start every item at its minimum and hand out one rank at a time to the highest priority.

    `priority(i, r)` scores giving item i its (r+1)-th rank while it holds r. Returns ranks summing to `budget`,
    each within [min_rank_i, max_rank_i]. Ties go to the lowest index, so the result is deterministic. Items at
    their maximum are skipped. With identical items and a priority that does not increase with r, the result is as
    even as the budget allows (round-robin).
    """
    if num_items < 1:
        raise InvalidInputError("rank allocation needs at least one item")
    lows = [min_rank] * num_items if isinstance(min_rank, int) else list(min_rank)
    highs = [max_rank] * num_items if isinstance(max_rank, int) else list(max_rank)
    if len(lows) != num_items or len(highs) != num_items:
        raise InvalidInputError(f"min/max rank lists must have {num_items} entries")
    if any(lo < 0 or lo > hi for lo, hi in zip(lows, highs)):
        raise InvalidInputError(f"each item needs 0 <= min_rank <= max_rank, got min {lows} max {highs}")
    if not sum(lows) <= budget <= sum(highs):
        raise InvalidInputError(f"budget {budget} is outside the reachable range [{sum(lows)}, {sum(highs)}] given the rank bounds")
    ranks = list(lows)
    for _ in range(budget - sum(lows)):
        best, best_score = -1, float("-inf")
        for i in range(num_items):
            if ranks[i] >= highs[i]:
                continue
            score = float(priority(i, ranks[i]))
            if score != score:
                raise NumericalError(f"rank priority of item {i} at rank {ranks[i]} is NaN")
            # strict '>': an equal score later never displaces the lower index; the first open item is the default
            if best < 0 or score > best_score:
                best, best_score = i, score
        ranks[best] += 1
    return ranks


def tail_energies(sigma: torch.Tensor) -> torch.Tensor:
    """tail[r] = sum_{m >= r} sigma_m^2 (0-indexed), float64 [k + 1] with tail[k] = 0."""
    energy = sigma.double() ** 2
    return torch.cat([energy.flip(0).cumsum(0).flip(0), energy.new_zeros(1)])


def residual_fraction(sigma: torch.Tensor, tail: torch.Tensor, rank: int) -> float:
    """The paper's score: energy of component rank+1 over the residual energy left at `rank` (0 if nothing is left)."""
    if rank >= sigma.numel() or tail[rank] <= 0:
        return 0.0
    return float(sigma[rank].double() ** 2 / tail[rank])


def propagation_horizon(layer: int, num_layers: int) -> float:
    """The code score's depth weight sqrt((L - l) / ((L + 1) / 2)): 1 on average, larger for early layers."""
    return math.sqrt((num_layers - layer) / ((num_layers + 1) / 2))


def allocate_ranks(
    spectra: Sequence[torch.Tensor],
    mean_rank: int,
    allocation: str = "uniform",
    score: str = "paper",
    min_rank: int | None = None,
    max_rank: int | None = None,
) -> list[int]:
    """Per-layer ranks for one matrix kind, summing to `len(spectra) * mean_rank`.

    spectra: one descending singular-value vector [k_l] per layer (k_l = the widest rank that layer allows).
    Adjusted defaults follow the authors' code: min_rank = max(1, mean_rank // 2), max_rank = 2 * mean_rank, the
    latter capped at each layer's width.
    """
    if allocation not in ALLOCATIONS:
        raise UnknownNameError(f"unknown allocation {allocation!r}; choose one of {ALLOCATIONS}")
    if score not in SCORES:
        raise UnknownNameError(f"unknown allocation score {score!r}; choose one of {SCORES}")
    num_layers = len(spectra)
    if num_layers == 0:
        raise InvalidInputError("rank allocation needs at least one layer")
    widths = [int(s.numel()) for s in spectra]
    if not 1 <= mean_rank <= min(widths):
        raise InvalidInputError(f"mean rank must be in [1, {min(widths)}] (the narrowest layer), got {mean_rank}")
    if allocation == "uniform":
        return [mean_rank] * num_layers

    low = max(1, mean_rank // 2) if min_rank is None else min_rank
    high = 2 * mean_rank if max_rank is None else max_rank
    if not 1 <= low <= mean_rank <= high:
        raise InvalidInputError(f"rank bounds must satisfy 1 <= min_rank <= mean rank <= max_rank, got {low} <= {mean_rank} <= {high}")
    highs = [min(high, w) for w in widths]
    # Scores as plain floats, precomputed per (layer, rank): the greedy loop asks for thousands of them.
    gains = [[residual_fraction(s, tail, r) for r in range(s.numel() + 1)] for s, tail in ((s, tail_energies(s)) for s in spectra)]

    def priority(layer: int, rank: int) -> float:
        gain = gains[layer][rank]
        if score == "paper":
            return gain
        return gain * propagation_horizon(layer, num_layers) / math.sqrt(max(rank, 1) / max(low, 1))

    return greedy_rank_allocation(num_layers, num_layers * mean_rank, priority, low, highs)
