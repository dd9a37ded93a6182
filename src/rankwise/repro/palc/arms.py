"""The arms of the PALC reproduction on cached features: PALC itself, the static steering controls (CAA and a
steering vector trained with PALC's loss, BiPO-like), and the measures every arm is scored by."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rankwise.recipes.palc import (CachedPairs, CachedSequences, LogitCalibrator, PalcConfig, PalcTrainConfig,
                                   SteeringOffset, drift_from_base, preference_accuracy, train_offsets)


@dataclass(frozen=True)
class Cached:
    train: CachedPairs
    val: CachedPairs
    test: CachedPairs
    neutral_val: CachedSequences
    neutral_test: CachedSequences
    output_weight: torch.Tensor  # [V, H]


def palc(c: Cached, bottleneck: int, lr: float, epochs: int, seed: int) -> LogitCalibrator:
    hidden, vocab = c.output_weight.shape[1], c.output_weight.shape[0]
    module = LogitCalibrator(hidden, vocab, PalcConfig(bottleneck=bottleneck), seed=seed)
    train_offsets(module, c.train, PalcTrainConfig(lr=lr, epochs=epochs, seed=seed))
    return module


def trained_vector(c: Cached, lr: float, epochs: int, seed: int) -> SteeringOffset:
    """A steering vector v [H] (from zero) trained with PALC's loss and optimiser: the position-independent control."""
    module = SteeringOffset(c.output_weight)
    train_offsets(module, c.train, PalcTrainConfig(lr=lr, epochs=epochs, seed=seed))
    return module


def caa(c: Cached, direction: torch.Tensor, alpha: float) -> SteeringOffset:
    return SteeringOffset(c.output_weight, alpha * direction)


def accuracy(module, pairs: CachedPairs, scale: float = 1.0) -> float:
    return preference_accuracy(module, pairs, scale)


def kl(module, seqs: CachedSequences, scale: float = 1.0) -> float:
    return drift_from_base(module, seqs, scale)["kl"]


def match_kl(candidates: list[tuple[float, SteeringOffset]], seqs: CachedSequences, budget: float) -> tuple[float, SteeringOffset]:
    """The candidate (alpha, module) with the largest alpha whose drift on `seqs` stays within `budget` (the
    smallest alpha when none does): the steering arm held to the same KL as the method."""
    within = [(a, m) for a, m in candidates if kl(m, seqs) <= budget]
    return max(within, key=lambda am: am[0]) if within else min(candidates, key=lambda am: am[0])
