"""Which samples of a test batch to send to the oracle, within the stream's label budget (card step 2), and the
selectors EMAC is compared with at the same budget.

- `BudgetSchedule`: B = round(budget * N) labels for the whole stream, spread evenly: after batch t at most
  floor((t + 1) B / T) have been spent (an unspent allowance carries forward), so the total never exceeds B.
- `RewardTracker`: the max-min entropy rewards, measured on the model before and after each update,
      Gamma_old = H(X_old; theta_{t-1}) - H(X_old; theta_t)    (old-class entropy fell: > 0)
      Gamma_new = H(X_new; theta_t) - H(X_new; theta_{t-1})    (new-class entropy rose: > 0)
  weighted by omega (the component with fewer annotations so far weighs more: the card's balancing weights, whose
  exact form the note does not give) and smoothed, R_t = alpha R'_t + (1 - alpha) R_{t-1}.
- `select_emac`: if R_old > R_new, the highest-entropy candidates assigned to the old component, else the
  lowest-entropy ones assigned to the new component (a sample belongs to the component of larger responsibility);
  candidates are X_mix (the method) or the whole batch (the ablation without the mixed-region restriction).
- baselines: `select_random`, `select_entropy` (top entropy), `select_coreset` (k-centre greedy against what is
  already labelled), `select_badge` (k-means++ seeding on gradient embeddings), `select_simatta` (k-centre greedy
  among the higher-entropy half: SimATTA's "diverse, uncertain" anchors without its incremental clustering).
Every selector takes a candidate mask [B] and returns at most k distinct indices from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rankwise.errors import InvalidInputError


class BudgetSchedule:
    """The even spread of `total` labels over `num_batches` batches (module docstring)."""

    def __init__(self, total: int, num_batches: int) -> None:
        if total < 0 or num_batches < 1:
            raise InvalidInputError(f"a budget schedule needs total >= 0 and num_batches >= 1, got {total}, {num_batches}")
        self.total, self.num_batches, self.spent = total, num_batches, 0

    def allowance(self, t: int) -> int:
        """Labels batch t (0-based) may spend."""
        return max(0, (t + 1) * self.total // self.num_batches - self.spent)

    def spend(self, n: int) -> None:
        if n < 0 or self.spent + n > self.total:
            raise InvalidInputError(f"spending {n} labels would exceed the budget ({self.spent} of {self.total} spent)")
        self.spent += n


@dataclass
class RewardTracker:
    """EMA-smoothed max-min entropy rewards (module docstring); `alpha` the weight of the newest reward."""

    alpha: float = 0.5
    r_old: float = 0.0
    r_new: float = 0.0
    annotated_old: int = 0
    annotated_new: int = 0
    history: list[tuple[float, float]] = field(default_factory=list)  # (Gamma_old, Gamma_new) per update

    @staticmethod
    def gammas(h_old_before: float, h_old_after: float, h_new_before: float, h_new_after: float) -> tuple[float, float]:
        """(Gamma_old, Gamma_new): positive when old-class entropy falls and new-class entropy rises."""
        return h_old_before - h_old_after, h_new_after - h_new_before

    def update(self, gamma_old: float, gamma_new: float) -> None:
        total = self.annotated_old + self.annotated_new + 2
        w_old, w_new = (self.annotated_new + 1) / total, (self.annotated_old + 1) / total
        self.r_old = self.alpha * w_old * gamma_old + (1 - self.alpha) * self.r_old
        self.r_new = self.alpha * w_new * gamma_new + (1 - self.alpha) * self.r_new
        self.history.append((gamma_old, gamma_new))

    def prefer_old(self) -> bool:
        return self.r_old > self.r_new


def _check(candidates: torch.Tensor, k: int) -> torch.Tensor:
    if candidates.dtype != torch.bool or candidates.dim() != 1:
        raise InvalidInputError(f"candidates must be a bool mask [B], got {candidates.dtype} {tuple(candidates.shape)}")
    if k < 0:
        raise InvalidInputError(f"k must be >= 0, got {k}")
    return candidates.nonzero().squeeze(1)


def select_emac(candidates: torch.Tensor, k: int, entropy: torch.Tensor, posterior_new: torch.Tensor,
                prefer_old: bool) -> torch.Tensor:
    """EMAC's rule (module docstring): entropy [B], posterior_new [B] (new component's responsibility)."""
    idx = _check(candidates, k)
    old = idx[posterior_new[idx] <= 0.5]
    new = idx[posterior_new[idx] > 0.5]
    old = old[torch.argsort(entropy[old], descending=True, stable=True)]  # most confused old-looking first
    new = new[torch.argsort(entropy[new], stable=True)]  # most confident new-looking first
    first, second = (old, new) if prefer_old else (new, old)
    return torch.cat([first, second])[:k]


def select_random(candidates: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    idx = _check(candidates, k)
    return idx[torch.randperm(idx.numel(), generator=generator)[:k]]


def select_entropy(candidates: torch.Tensor, k: int, entropy: torch.Tensor) -> torch.Tensor:
    idx = _check(candidates, k)
    return idx[torch.argsort(entropy[idx], descending=True, stable=True)[:k]]


def _k_centre(points: torch.Tensor, k: int, centres: torch.Tensor) -> list[int]:
    """Greedy k-centre: repeatedly the point farthest from every centre (`centres` [M, D], may be empty; an empty
    set starts from the point farthest from the points' mean)."""
    chosen: list[int] = []
    if points.shape[0] == 0 or k == 0:
        return chosen
    ref = centres if centres.shape[0] else points.mean(0, keepdim=True)
    dist = torch.cdist(points, ref).min(1).values
    for _ in range(min(k, points.shape[0])):
        i = int(torch.argmax(dist))
        chosen.append(i)
        dist = torch.minimum(dist, torch.cdist(points, points[i:i + 1]).squeeze(1))
        dist[chosen] = -1.0
    return chosen


def select_coreset(candidates: torch.Tensor, k: int, features: torch.Tensor, labelled: torch.Tensor) -> torch.Tensor:
    """k-centre greedy on L2-normalised features [B, D], the labelled store's features [M, D] as the first centres."""
    idx = _check(candidates, k)
    z = torch.nn.functional.normalize(features.detach(), dim=1)
    centres = torch.nn.functional.normalize(labelled.detach(), dim=1) if labelled.numel() else z[:0]
    return idx[torch.tensor(_k_centre(z[idx], k, centres), dtype=torch.int64)]


def select_simatta(candidates: torch.Tensor, k: int, features: torch.Tensor, entropy: torch.Tensor,
                   labelled: torch.Tensor) -> torch.Tensor:
    """k-centre greedy (as `select_coreset`) among the candidates whose entropy is at least the candidates' median."""
    idx = _check(candidates, k)
    if idx.numel() == 0:
        return idx
    uncertain = torch.zeros_like(candidates)
    uncertain[idx[entropy[idx] >= entropy[idx].median()]] = True
    return select_coreset(uncertain, k, features, labelled)


def select_badge(candidates: torch.Tensor, k: int, features: torch.Tensor, probs: torch.Tensor,
                 generator: torch.Generator) -> torch.Tensor:
    """BADGE: k-means++ seeding on the gradient embeddings (p - onehot(argmax p)) (x) z of the candidates (the last
    layer's cross-entropy gradient at the predicted label): large and diverse gradients."""
    idx = _check(candidates, k)
    if idx.numel() == 0 or k == 0:
        return idx[:0]
    p = probs.detach()[idx]
    g = (p - torch.nn.functional.one_hot(p.argmax(1), p.shape[1]).to(p.dtype)).unsqueeze(2) * features.detach()[idx].unsqueeze(1)
    g = g.flatten(1)
    first = int(torch.argmax(g.norm(dim=1)))
    chosen = [first]
    dist = (g - g[first]).pow(2).sum(1)
    while len(chosen) < min(k, idx.numel()):
        weights = dist.clamp_min(0.0)
        weights[chosen] = 0.0
        if float(weights.sum()) <= 0:
            break
        i = int(torch.multinomial(weights, 1, generator=generator))
        chosen.append(i)
        dist = torch.minimum(dist, (g - g[i]).pow(2).sum(1))
    return idx[torch.tensor(chosen, dtype=torch.int64)]
