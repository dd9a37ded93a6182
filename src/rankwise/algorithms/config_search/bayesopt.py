"""CoA-LoRA's Pareto-driven proposal of new configurations: two Gaussian processes, qLogEHVI, integer hill-climbing.

A configuration is an integer vector x in prod_j {0, ..., n_j - 1} (for CoA-LoRA: 5 knob indices per layer). From
an archive of evaluated configurations with objectives (bits, loss), both minimised:

1. Fit two independent BoTorch `SingleTaskGP`s (RBF kernel with one lengthscale per dimension; BoTorch's default
   lengthscale prior scales with sqrt(d), as the authors' code fixes the initial lengthscale at sqrt(d)) to
   y = (-bits, -loss) on inputs normalised to [0, 1] (x_j / (n_j - 1)). Maximisation convention throughout
   (card pitfall: mixing signs silently inverts the search).
2. The acquisition is qLogExpectedHypervolumeImprovement over the archive's front, with the reference point just
   worse than the worst archived value of each objective (ours: the authors' (0, 0) reference bounds nothing when
   both objectives are negated costs).
3. From `n_starts` archive points drawn at random, integer hill-climbing: the finite-difference "gradient"
   g_j = (a(x + e_j) - a(x - e_j)) / 2 per coordinate (a one-sided difference at a boundary), move the single
   coordinate with the largest |g_j| by sign(g_j), at most `max_steps` (default d) times; stop when that move would
   leave the box or no coordinate improves. The end points, minus duplicates of the archive, are the candidates.

Randomness (start points, MC samples) is a pure function of `seed`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rankwise.errors import InvalidInputError


@dataclass(frozen=True)
class Proposal:
    candidates: np.ndarray  # int64 [m, d], new configurations (not in the archive, distinct)
    starts: np.ndarray  # int64 [n_starts, d], where the climbs began
    steps: tuple[int, ...]  # moves made by each climb


def _check(x: np.ndarray, cards: np.ndarray, bits: np.ndarray, losses: np.ndarray) -> None:
    if x.ndim != 2 or x.shape[1] != cards.size:
        raise InvalidInputError(f"archive must be [n, {cards.size}] integer configurations, got shape {x.shape}")
    if np.any(cards < 1):
        raise InvalidInputError(f"every dimension needs at least one value, got cardinalities {cards.tolist()}")
    if np.any(x < 0) or np.any(x >= cards[None, :]):
        raise InvalidInputError("archive configurations must lie in 0 <= x_j < n_j for every dimension")
    if bits.shape != (x.shape[0],) or losses.shape != (x.shape[0],):
        raise InvalidInputError(f"need one (bits, loss) pair per archived configuration ({x.shape[0]}), got "
                                f"{bits.shape} and {losses.shape}")
    if x.shape[0] < 2:
        raise InvalidInputError("a GP needs at least 2 archived configurations")
    if not (np.all(np.isfinite(bits)) and np.all(np.isfinite(losses))):
        raise InvalidInputError("archived bits and losses must be finite")


def _fit_models(train_x: torch.Tensor, train_y: torch.Tensor):
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import ModelListGP, SingleTaskGP
    from botorch.models.transforms import Standardize
    from gpytorch.mlls import ExactMarginalLogLikelihood

    models = []
    for k in range(train_y.size(1)):
        gp = SingleTaskGP(train_x, train_y[:, k : k + 1], outcome_transform=Standardize(m=1))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # optimizer-convergence and input-scaling notices on tiny archives
            fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
        models.append(gp)
    return ModelListGP(*models)


def propose_configurations(x: Sequence[Sequence[int]], cards: Sequence[int], bits: Sequence[float], losses: Sequence[float],
                           n_starts: int = 5, max_steps: int | None = None, seed: int = 0, mc_samples: int = 64) -> Proposal:
    """New configurations by qLogEHVI hill-climbing from `n_starts` archive points (see the module docstring).

    x: int [n, d] archived configurations; cards: [d] values per dimension; bits, losses: [n] their objectives."""
    from botorch.acquisition.multi_objective.logei import qLogExpectedHypervolumeImprovement
    from botorch.sampling import SobolQMCNormalSampler
    from botorch.utils.multi_objective.box_decompositions.non_dominated import FastNondominatedPartitioning

    xa, ca = np.asarray(x, dtype=np.int64), np.asarray(cards, dtype=np.int64)
    ba, la = np.asarray(bits, dtype=np.float64), np.asarray(losses, dtype=np.float64)
    _check(xa, ca, ba, la)
    if n_starts < 1:
        raise InvalidInputError(f"n_starts must be >= 1, got {n_starts}")
    d = ca.size
    steps_cap = d if max_steps is None else max_steps
    denom = torch.tensor(np.maximum(ca - 1, 1), dtype=torch.float64)
    norm = lambda v: torch.as_tensor(v, dtype=torch.float64) / denom  # noqa: E731
    y = torch.tensor(np.stack([-ba, -la], axis=1), dtype=torch.float64)
    span = (y.max(0).values - y.min(0).values).clamp_min(1e-6)
    ref = y.min(0).values - 0.1 * span
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = _fit_models(norm(xa), y)
        partitioning = FastNondominatedPartitioning(ref_point=ref, Y=y)
        sampler = SobolQMCNormalSampler(sample_shape=torch.Size([mc_samples]), seed=seed)
        acq = qLogExpectedHypervolumeImprovement(model, ref_point=ref.tolist(), partitioning=partitioning, sampler=sampler)
        rng = np.random.default_rng(seed)
        starts = xa[rng.choice(len(xa), size=min(n_starts, len(xa)), replace=False)]
        ends, moves = [], []
        for start in starts:
            end, made = _climb(acq, start.copy(), ca, steps_cap, norm)
            ends.append(end)
            moves.append(made)
    seen = {tuple(r) for r in xa.tolist()}
    fresh: list[list[int]] = []
    for e in ends:
        if tuple(e.tolist()) not in seen:
            seen.add(tuple(e.tolist()))
            fresh.append(e.tolist())
    return Proposal(np.asarray(fresh, dtype=np.int64).reshape(-1, d), starts, tuple(moves))


@torch.no_grad()
def _climb(acq, x: np.ndarray, cards: np.ndarray, max_steps: int, norm) -> tuple[np.ndarray, int]:
    d = x.size
    made = 0
    for _ in range(max_steps):
        up, down = np.repeat(x[None], d, 0), np.repeat(x[None], d, 0)
        idx = np.arange(d)
        up[idx, idx] = np.minimum(x + 1, cards - 1)
        down[idx, idx] = np.maximum(x - 1, 0)
        values = acq(norm(np.concatenate([up, down]))[:, None, :]).double()  # [2d] (q = 1)
        a_up, a_down = values[:d].numpy(), values[d:].numpy()
        g = (a_up - a_down) / 2
        j = int(np.argmax(np.abs(g)))
        if not np.isfinite(g[j]) or g[j] == 0:
            break
        step = 1 if g[j] > 0 else -1
        if not 0 <= x[j] + step < cards[j]:
            break  # the move would leave the box: stop at the boundary
        x[j] += step
        made += 1
    return x, made
