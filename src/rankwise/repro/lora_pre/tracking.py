"""How well does a rank-r optimizer state follow a drifting gradient's moving average? (LoRA-Pre vs GaLore.)

A synthetic stream g_t = U_t S V_t^T + noise, whose rank-k singular subspaces U_t, V_t rotate a little every step,
is averaged exactly (m_t = beta m_{t-1} + (1-beta) g_t) and by three rank-r trackers:
  lora-pre  the factors m_B m_A updated every step by LoRA-Pre's Newton regression (gamma = 1 - sqrt(beta));
  galore    GaLore's scheme: an r-dim subspace P from the SVD of the gradient, refreshed every `refresh` steps, the
            EMA kept in that subspace (P^T g averaged; the low-dim state is kept, not re-projected, at a refresh,
            as galore-torch does) and read back as P m_low;
  oracle    the best rank-r approximation of the exact m_t (truncated SVD), a lower bound.
Each reports the relative error ||m~_t - m_t|| / ||m_t||.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rankwise.optim.low_rank_regression import gamma_for_beta, newton_factor_step_


@dataclass
class TrackingResult:
    steps: list[int]  # the steps at which all three errors were measured
    errors: dict[str, list[float]]  # tracker name -> relative error at those steps
    refresh: int

    def mean_error(self, name: str, after: int = 0) -> float:
        vals = [e for s, e in zip(self.steps, self.errors[name]) if s > after]
        return sum(vals) / len(vals)


def _rotate(basis: torch.Tensor, angle: float, gen: torch.Generator) -> torch.Tensor:
    """A random small rotation of an orthonormal basis [n, k]: each column moves by about `angle` radians."""
    n = basis.shape[0]
    moved = basis + angle * torch.randn(basis.shape, generator=gen, dtype=basis.dtype) / n**0.5
    return torch.linalg.qr(moved).Q


def track_drifting_momentum(
    dim: int = 256,
    true_rank: int = 8,
    rank: int = 8,
    steps: int = 2000,
    beta: float = 0.9,
    refresh: int = 200,
    angle: float = 0.02,
    noise: float = 0.5,
    measure_every: int = 5,
    seed: int = 0,
) -> TrackingResult:
    """Run the three trackers on one synthetic stream ([dim, dim] gradients); errors every `measure_every` steps.

    `noise` is the Frobenius norm of the per-step Gaussian noise relative to the signal's; `angle` the per-step
    rotation of each singular vector (radians).
    """
    gen = torch.Generator().manual_seed(seed)
    dt = torch.float64
    u = torch.linalg.qr(torch.randn(dim, true_rank, generator=gen, dtype=dt)).Q
    v = torch.linalg.qr(torch.randn(dim, true_rank, generator=gen, dtype=dt)).Q
    s = torch.logspace(0, -1, true_rank, dtype=dt)  # singular values 1 .. 0.1
    noise_std = noise * float(s.norm()) / dim  # so that ||noise||_F ~= noise * ||signal||_F

    exact = torch.zeros(dim, dim, dtype=dt)
    m_b = torch.zeros(dim, rank, dtype=dt)
    m_a = 0.02 * torch.randn(rank, dim, generator=gen, dtype=dt)
    gamma = gamma_for_beta(beta, 2)
    projector: torch.Tensor | None = None
    low = torch.zeros(rank, dim, dtype=dt)

    out = TrackingResult(steps=[], errors={"lora-pre": [], "galore": [], "oracle": []}, refresh=refresh)
    for t in range(steps):
        u, v = _rotate(u, angle, gen), _rotate(v, angle, gen)
        g = u @ torch.diag(s) @ v.T + noise_std * torch.randn(dim, dim, generator=gen, dtype=dt)
        exact.mul_(beta).add_(g, alpha=1 - beta)
        newton_factor_step_(m_b, m_a, g, gamma)
        if t % refresh == 0:
            projector = torch.linalg.svd(g, full_matrices=False).U[:, :rank]
        low.mul_(beta).add_(projector.T @ g, alpha=1 - beta)
        if (t + 1) % measure_every == 0:
            norm = exact.norm()
            uu, ss, vh = torch.linalg.svd(exact, full_matrices=False)
            oracle = (uu[:, :rank] * ss[:rank]) @ vh[:rank]
            out.steps.append(t + 1)
            out.errors["lora-pre"].append(float((m_b @ m_a - exact).norm() / norm))
            out.errors["galore"].append(float((projector @ low - exact).norm() / norm))
            out.errors["oracle"].append(float((oracle - exact).norm() / norm))
    return out
