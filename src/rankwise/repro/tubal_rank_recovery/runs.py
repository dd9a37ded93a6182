"""One problem instance (X*, measurements, noise) and a batch of FGD runs on it, sharing the measurement matrix."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rankwise.algorithms.tubal import (
    FGDResult, GaussianMeasurements, factorized_gd, low_tubal_rank_psd, small_init, spectral_init,
)

SMALL, SPECTRAL = "small", "spectral"


@dataclass(frozen=True)
class Problem:
    truth: torch.Tensor  # X* [n, n, k], ||X*|| = 1
    train: GaussianMeasurements
    y_train: torch.Tensor
    val: GaussianMeasurements
    y_val: torch.Tensor
    snr_db: float  # measured ||M(X*)||^2 / ||noise||^2 in dB
    rank: int


def make_problem(n: int, rank: int, k: int, m_factor: float, val_fraction: float, snr_db: float,
                 seed: int) -> Problem:
    """X* = X * X^T (||X*|| = 1), m = m_factor n r k Gaussian measurements, Gaussian noise at `snr_db`."""
    truth = low_tubal_rank_psd(n, rank, k, seed=seed)
    m = int(round(m_factor * n * rank * k))
    ops = GaussianMeasurements.draw(m, (n, n, k), seed=seed + 1)
    clean = ops(truth)
    sigma = math.sqrt(float(clean.pow(2).mean()) / 10 ** (snr_db / 10))
    noise = sigma * torch.randn(m, generator=torch.Generator().manual_seed(seed + 2), dtype=torch.float64)
    y = clean + noise
    n_val = max(1, int(round(val_fraction * m)))
    train, val = ops.split(n_val)
    measured = 10 * math.log10(float(clean.pow(2).sum()) / float(noise.pow(2).sum()))
    return Problem(truth, train, y[:-n_val], val, y[-n_val:], measured, rank)


@dataclass(frozen=True)
class RunSpec:
    init: str  # small / spectral
    rank: int  # R
    step: float
    alpha: float = 0.0  # the small initialisation's scale


def initial_factor(p: Problem, spec: RunSpec, seed: int) -> torch.Tensor:
    n, _, k = p.truth.shape
    if spec.init == SPECTRAL:
        return spectral_init(p.train, p.y_train, spec.rank)
    return small_init(n, spec.rank, k, spec.alpha, seed=seed * 1000 + spec.rank)


def run_batch(p: Problem, specs: list[RunSpec], iterations: int, seed: int, desc: str = "FGD") -> list[FGDResult]:
    """All `specs` in one batched FGD (factors zero-padded to the largest R); one FGDResult view per spec."""
    n, _, k = p.truth.shape
    r_max = max(s.rank for s in specs)
    u0 = torch.zeros(len(specs), n, r_max, k, dtype=torch.float64)
    for i, s in enumerate(specs):
        u0[i, :, : s.rank] = initial_factor(p, s, seed)
    steps = torch.tensor([s.step for s in specs], dtype=torch.float64)
    res = factorized_gd(p.train, p.y_train, u0, step=steps, iterations=iterations, validation=(p.val, p.y_val),
                        truth=p.truth, desc=desc)
    out = []
    for i, s in enumerate(specs):
        out.append(FGDResult(
            factor=res.factor[i, :, : s.rank], estimate=res.estimate[i], final_factor=res.final_factor[i, :, : s.rank],
            es_step=res.es_step[i], train_loss=res.train_loss[:, i],
            val_loss=None if res.val_loss is None else res.val_loss[:, i],
            rse=None if res.rse is None else res.rse[:, i], diverged=res.diverged[i]))
    return out
