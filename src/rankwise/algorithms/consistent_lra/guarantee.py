"""What a stream promises at a step (`Guarantee`) and what it did at every step (`StreamTrace`).

Three kinds of promise, each with a slack for float64 rounding (`linalg.rounding_slack`):

- `additive`:       cost_t <= OPT_t + eps * ||A^(t)||_F^2
- `multiplicative`: cost_t <= (1 + eps) * OPT_t            (for t <= k, OPT_t = 0: the subspace must hold every row)
- `exact`:          cost_t <= OPT_t                         (the recompute-every-step baseline)

`certified` says whether the promise holds by construction at every step (lazy additive, verify-then-recompute,
recompute-every-step, Frequent Directions' deterministic bound) or only with high probability (ridge-leverage
sampling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rankwise.algorithms.consistent_lra.linalg import change_tolerance, rounding_slack
from rankwise.errors import InvalidInputError

KINDS = ("additive", "multiplicative", "exact")


def guarantee_bound(kind: str, eps: float, opt: torch.Tensor, frob2: torch.Tensor, slack: torch.Tensor) -> torch.Tensor:
    """The largest cost the promise of `kind` allows, elementwise over steps."""
    if kind == "additive":
        return opt + eps * frob2 + slack
    if kind == "multiplicative":
        return (1.0 + eps) * opt + slack
    if kind == "exact":
        return opt + slack
    raise InvalidInputError(f"guarantee kind must be one of {KINDS}, got {kind!r}")


@dataclass(frozen=True)
class Guarantee:
    """The promise at one step, with the numbers that decide it. `opt` is computed exactly (float64 eigenvalues)."""

    kind: str
    eps: float
    step: int
    cost: float
    opt: float
    frob2: float
    bound: float
    certified: bool

    @property
    def holds(self) -> bool:
        return self.cost <= self.bound

    @property
    def ratio(self) -> float:
        """cost / OPT (1.0 when both are 0, inf when only OPT is)."""
        if self.opt > 0:
            return self.cost / self.opt
        return 1.0 if self.cost <= self.bound else math.inf

    @property
    def additive_error(self) -> float:
        """(cost - OPT) / ||A^(t)||_F^2, the quantity the additive promise bounds by eps."""
        return (self.cost - self.opt) / self.frob2 if self.frob2 > 0 else 0.0


@dataclass(frozen=True)
class StreamTrace:
    """Per-step record of a stream, one entry per row fed (tensors [n], float64 unless noted).

    `step_recourse[t] = ||P_t - P_{t-1}||_F^2` (the card's recourse; the first output is measured from the initial
    basis), `recomputed[t]` (bool) says whether the algorithm recomputed its subspace at t, `opt` is OPT_t where the
    algorithm computes it (verify-then-recompute, recompute-every-step, or `track_opt=True`), else None.
    """

    kind: str
    eps: float
    rank: int
    dim: int
    frob2: torch.Tensor
    cost: torch.Tensor
    step_recourse: torch.Tensor
    recomputed: torch.Tensor
    opt: torch.Tensor | None = None
    first_step: int = 1

    def __len__(self) -> int:
        return int(self.frob2.numel())

    @property
    def steps(self) -> torch.Tensor:
        """Step numbers t (1-based, counted from the stream's first row) [n], int64."""
        return torch.arange(self.first_step, self.first_step + len(self), dtype=torch.int64)

    @property
    def recourse(self) -> torch.Tensor:
        """Cumulative recourse sum_{s<=t} ||P_s - P_{s-1}||_F^2 [n]."""
        return torch.cumsum(self.step_recourse, 0)

    @property
    def path_length(self) -> torch.Tensor:
        """Cumulative unsquared recourse sum_{s<=t} ||P_s - P_{s-1}||_F [n] (the distance travelled)."""
        return torch.cumsum(self.step_recourse.sqrt(), 0)

    @property
    def changed(self) -> torch.Tensor:
        """Steps at which the subspace moved by more than rounding [n] bool."""
        return self.step_recourse > change_tolerance(self.rank, self.dim)

    @property
    def changes(self) -> torch.Tensor:
        """Cumulative number of subspace changes [n] int64."""
        return torch.cumsum(self.changed.to(torch.int64), 0)

    def _opt(self, opt: torch.Tensor | None) -> torch.Tensor:
        o = self.opt if opt is None else torch.as_tensor(opt, dtype=torch.float64)
        if o is None:
            raise InvalidInputError("this trace has no OPT_t: build the stream with track_opt=True, or pass "
                                    "opt=prefix_optimal_cost(rows, rank)")
        if o.shape != self.frob2.shape:
            raise InvalidInputError(f"opt must have one value per step ({len(self)}), got shape {tuple(o.shape)}")
        return o

    def bound(self, opt: torch.Tensor | None = None, kind: str | None = None) -> torch.Tensor:
        """The largest cost the stream's promise allows at every step [n]; `kind` ("additive" / "multiplicative"):
        another promise at the same eps, to ask whether this stream also met it (default: its own)."""
        o = self._opt(opt)
        return guarantee_bound(self.kind if kind is None else kind, self.eps, o, self.frob2,
                               rounding_slack(self.frob2, self.dim, self.steps))

    def holds(self, opt: torch.Tensor | None = None) -> torch.Tensor:
        """Whether the promise holds at every step [n] bool."""
        return self.cost <= self.bound(opt)

    def violation(self, opt: torch.Tensor | None = None, kind: str | None = None) -> torch.Tensor:
        """(cost - bound) / ||A^(t)||_F^2 at every step [n]: <= 0 where the promise (its own, or `kind`) holds."""
        return (self.cost - self.bound(opt, kind)) / self.frob2.clamp_min(torch.finfo(torch.float64).tiny)

    def ratio(self, opt: torch.Tensor | None = None) -> torch.Tensor:
        """cost / OPT at every step [n]; steps with OPT within rounding of 0 read 1 if the cost is too, else inf."""
        o = self._opt(opt)
        slack = rounding_slack(self.frob2, self.dim, self.steps)
        zero = o <= slack
        r = self.cost / torch.where(zero, torch.ones_like(o), o)
        return torch.where(zero, torch.where(self.cost <= 2 * slack, torch.ones_like(o), torch.full_like(o, math.inf)), r)

    def additive_error(self, opt: torch.Tensor | None = None) -> torch.Tensor:
        """(cost - OPT) / ||A^(t)||_F^2 at every step [n]."""
        return (self.cost - self._opt(opt)) / self.frob2.clamp_min(torch.finfo(torch.float64).tiny)
