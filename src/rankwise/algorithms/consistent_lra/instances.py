"""Synthetic row streams from the card: the adversarial alternation (S1) and the lower-bound phases (S3).

Both return float64 numpy arrays [n, d]; a seed fixes every random choice.
"""

from __future__ import annotations

import numpy as np

from rankwise.errors import InvalidInputError


def _check(n: int, dim: int, rank: int, need: int) -> None:
    for name, v in (("n", n), ("dim", dim), ("rank", rank)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise InvalidInputError(f"{name} must be a positive integer, got {v!r}")
    if dim < need:
        raise InvalidInputError(f"dim={dim} is too small for rank={rank}: this stream needs dim >= {need}")


def _orthonormal(rng: np.random.Generator, dim: int, count: int) -> np.ndarray:
    q, _ = np.linalg.qr(rng.standard_normal((dim, count)))
    return q.T  # [count, dim]


def adversarial_alternation(n: int, dim: int = 40, rank: int = 5, *, seed: int = 0, burst_every: int = 2,
                            burst: float = 4.0, base_scale: tuple[float, float] = (8.0, 5.0),
                            noise: float = 0.05) -> np.ndarray:
    """S1: sigma_k and sigma_{k+1} cross at every burst, by a margin that shrinks relative to OPT.

    Rows are Gaussian in a fixed random rank-(k-1) subspace (per-direction standard deviations from
    base_scale[0] down to base_scale[1]: large energy, always the top k-1 directions), plus isotropic noise of
    standard deviation `noise`. Every `burst_every`-th row is instead a pure burst along u or w (two further
    orthonormal directions), alternately: the first of squared norm `burst`, the others 2 x `burst`, so after every burst the
    burst direction leads the other by exactly `burst`. The k-th singular direction therefore swaps at every burst,
    while the margin `burst` becomes a vanishing fraction of OPT_t ~ (t / burst_every) x burst / 2.
    Returns [n, dim] float64.
    """
    _check(n, dim, rank, rank + 1)
    if rank < 2:
        raise InvalidInputError(f"rank must be >= 2 for the alternation (k-1 base directions + a swap), got {rank}")
    rng = np.random.default_rng(seed)
    basis = _orthonormal(rng, dim, rank + 1)
    base, u, w = basis[: rank - 1], basis[rank - 1], basis[rank]
    scales = np.linspace(base_scale[0], base_scale[1], rank - 1)
    rows = (rng.standard_normal((n, rank - 1)) * scales) @ base + noise * rng.standard_normal((n, dim))
    bursts = np.arange(burst_every - 1, n, burst_every)
    norms = np.full(bursts.size, np.sqrt(2.0 * burst))
    if bursts.size:
        norms[0] = np.sqrt(burst)
    directions = np.where((np.arange(bursts.size) % 2 == 0)[:, None], u, w)
    rows[bursts] = norms[:, None] * directions  # pure bursts: no cross terms that would blur the swap
    return rows


def lower_bound_phases(n: int, dim: int = 20, rank: int = 5, eps: float = 0.1, *,
                       seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """S3 (the card's reconstruction of the lower-bound instance): two orthogonal k-dimensional subspaces U0, U1.

    Phase j appends unit rows cycling through an orthonormal basis of U_{j mod 2} until that subspace's energy
    exceeds (1 + 3 eps) times the other's (and at least k rows), so every phase forces a (1 + eps)-algorithm to
    switch. Energies grow geometrically, so the number of phases grows like log_{1+3eps}(n / k).
    Returns (rows [n, dim] float64, phase index of every row [n] int64).
    """
    _check(n, dim, rank, 2 * rank)
    if not 0 < eps < 1:
        raise InvalidInputError(f"eps must be in (0, 1), got {eps!r}")
    rng = np.random.default_rng(seed)
    basis = _orthonormal(rng, dim, 2 * rank)
    spaces = (basis[:rank], basis[rank:])
    energy, lengths, total = [0, 0], [], 0
    while total < n:
        j = len(lengths) % 2
        need = max(rank, int(np.floor((1 + 3 * eps) * energy[1 - j])) - energy[j] + 1)
        need = min(need, n - total)
        lengths.append(need)
        energy[j] += need
        total += need
    phase = np.repeat(np.arange(len(lengths)), lengths)
    rows = np.empty((n, dim))
    for j in (0, 1):
        mask = phase % 2 == j
        rows[mask] = spaces[j][np.arange(int(mask.sum())) % rank]  # keeps cycling across phases: energy stays even
    return rows, phase
