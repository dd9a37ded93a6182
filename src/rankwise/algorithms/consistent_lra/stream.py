"""The streaming interface every consistent low-rank algorithm and baseline shares (`SubspaceStream`).

    stream = LazyAdditiveLRA(dim=64, rank=10, eps=0.1)
    stream.update(row)              # one row [d] or a block [n, d], numpy or torch
    stream.basis                    # V [k, d] float64, orthonormal rows: the current subspace
    stream.recourse, stream.changes # sum_t ||P_t - P_{t-1}||_F^2, number of steps at which V moved
    stream.guarantee()              # the promise at the current step, with exact OPT_t
    stream.trace                    # per-step record (cost, recourse, recomputations, OPT_t where known)

A stream outputs one subspace after every row, also when rows arrive in blocks: a block is processed with batched
linear algebra (prefix Gram stacks, cumulative sums of projected norms), not a Python step per row, and gives the
same per-step record as feeding the rows one at a time. Before any row the subspace is the first k coordinate
vectors; moving away from it counts as recourse like any other move.

Input is validated before any work: a refused block (wrong width, empty, non-finite) raises and leaves the stream
exactly as it was; so does an error raised while processing (the state is restored).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rankwise.algorithms.consistent_lra.guarantee import Guarantee, StreamTrace, guarantee_bound
from rankwise.algorithms.consistent_lra.linalg import (
    captured_energy, prefix_optimal_cost, projector_distance, rounding_slack, tail_energy,
)
from rankwise.errors import InvalidInputError, NumericalError


def as_rows(rows: Any, dim: int) -> torch.Tensor:
    """Validate one row [d] or a block [n, d] (numpy, torch or nested lists) and return it as float64 [n, d]."""
    if isinstance(rows, torch.Tensor):
        x = rows.detach().to("cpu")
    else:
        try:
            arr = np.asarray(rows)
        except (TypeError, ValueError) as e:
            raise InvalidInputError(f"rows must be an array of numbers, got {type(rows).__name__}: {e}") from None
        if arr.dtype.kind not in "biuf":
            raise InvalidInputError(f"rows must be real numbers, got dtype {arr.dtype}")
        x = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float64))
    if x.is_complex() or not (x.is_floating_point() or x.dtype in (torch.bool, torch.int8, torch.int16, torch.int32,
                                                                     torch.int64, torch.uint8)):
        raise InvalidInputError(f"rows must be real numbers, got dtype {x.dtype}")
    if x.dim() == 1:
        x = x[None, :]
    if x.dim() != 2:
        raise InvalidInputError(f"pass one row [d] or a block of rows [n, d]; got shape {tuple(x.shape)}")
    if x.shape[0] == 0:
        raise InvalidInputError("empty input: the block has no rows; pass at least one row [d] or [n, d] with n >= 1")
    if x.shape[1] != dim:
        raise InvalidInputError(f"rows have width {x.shape[1]} but this stream has dimension d={dim}; "
                                f"pass rows of shape [{dim}] or [n, {dim}]")
    x = x.to(torch.float64)
    bad = ~torch.isfinite(x).all(dim=1)
    if bool(bad.any()):
        first = int(bad.nonzero()[0, 0])
        raise NumericalError(f"row {first} of the block (and {int(bad.sum()) - 1} more) has NaN or Inf entries; "
                             "the stream was left unchanged: clean or drop those rows and feed the block again")
    return x


@dataclass
class _Block:
    """What a subclass returns for a block: per-step costs, recourse, recomputation flags, OPT (or None)."""

    cost: torch.Tensor
    step_recourse: torch.Tensor
    recomputed: torch.Tensor
    opt: torch.Tensor | None = None


class SubspaceStream(ABC):
    """A rank-k subspace kept over a stream of d-dimensional rows, with recourse accounting and its promise.

    Subclasses set `kind` ("additive" / "multiplicative" / "exact"), `certified`, and implement `_process(rows,
    frob2)`, which may read the state as it was before the block (`_gram`, `_frob2`, `_t`, `_basis`) and must
    replace (never modify in place) the tensors it changes, so that a failed block can be rolled back.
    """

    kind: str = "multiplicative"
    certified: bool = True

    def __init__(self, dim: int, rank: int, eps: float, *, track_opt: bool = False) -> None:
        for name, v in (("dim", dim), ("rank", rank)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise InvalidInputError(f"{name} must be a positive integer, got {v!r}")
        if rank > dim:
            raise InvalidInputError(f"rank k={rank} is larger than the dimension d={dim}: a rank-k subspace of "
                                    f"R^{dim} needs k <= {dim}")
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or not 0 < eps < 1:
            raise InvalidInputError(f"eps must be a number in (0, 1), got {eps!r}")
        self.dim, self.rank, self.eps = int(dim), int(rank), float(eps)
        self.track_opt = bool(track_opt)
        self._gram = torch.zeros(self.dim, self.dim, dtype=torch.float64)
        self._frob2 = 0.0
        self._t = 0
        self._basis = torch.eye(self.rank, self.dim, dtype=torch.float64)
        self._recomputations = 0
        self._blocks: list[StreamTrace] = []
        self._trace_cache: StreamTrace | None = None

    # --- feeding rows -------------------------------------------------------------------------------------------

    def update(self, rows: Any) -> StreamTrace:
        """Feed one row [d] or a block [n, d]; returns the per-step record of this block (also kept in `trace`)."""
        x = as_rows(rows, self.dim)
        saved = {k: (list(v) if isinstance(v, list) else v) for k, v in self.__dict__.items()}
        try:
            frob2 = self._frob2 + torch.cumsum((x * x).sum(1), 0)
            block = self._process(x, frob2)
            if block.opt is None and self.track_opt:
                block.opt = prefix_optimal_cost(x, self.rank, self._gram)
            self._recomputations += int(block.recomputed.sum())
            trace = StreamTrace(self.kind, self._trace_eps(), self.rank, self.dim, frob2, block.cost,
                                block.step_recourse, block.recomputed, block.opt, first_step=self._t + 1)
            self._gram = self._gram + x.T @ x
            self._frob2 = float(frob2[-1])
            self._t += x.shape[0]
            self._blocks.append(trace)
            self._trace_cache = None
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(saved)
            raise
        return trace

    def extend(self, rows: Any) -> StreamTrace:
        """Alias of `update` for a block of rows."""
        return self.update(rows)

    @abstractmethod
    def _process(self, rows: torch.Tensor, frob2: torch.Tensor) -> _Block:
        """Consume `rows` [n, d] (float64, validated); `frob2` [n] is ||A^(t)||_F^2 after each of them."""

    # --- helpers for subclasses ---------------------------------------------------------------------------------

    def _held_costs(self, basis: torch.Tensor, gram_before: torch.Tensor, rows: torch.Tensor,
                    frob2: torch.Tensor) -> torch.Tensor:
        """Per-step cost of holding `basis` while `rows` arrive after a prefix with Gram `gram_before`:
        F_t - tr(V G_before V^T) - cumsum ||V a_i||^2 (O(n k d) instead of a d x d product per step)."""
        captured = captured_energy(basis, gram_before) + torch.cumsum((rows @ basis.T).pow(2).sum(1), 0)
        return (frob2 - captured).clamp_min(0.0)

    def _move(self, new_basis: torch.Tensor) -> float:
        """Replace the basis; returns the recourse ||P_new - P_old||_F^2 of the move."""
        step = float(projector_distance(self._basis, new_basis))
        self._basis = new_basis
        return step

    def _trace_eps(self) -> float:
        return self.eps

    # --- what the stream exposes --------------------------------------------------------------------------------

    @property
    def basis(self) -> torch.Tensor:
        """The current subspace: orthonormal rows V [k, d] float64."""
        return self._basis.clone()

    @property
    def projector(self) -> torch.Tensor:
        """P = V^T V [d, d]: symmetric, idempotent, trace k."""
        return self._basis.T @ self._basis

    @property
    def steps(self) -> int:
        """Rows fed so far (t)."""
        return self._t

    @property
    def gram(self) -> torch.Tensor:
        """A^(t)T A^(t) [d, d] float64."""
        return self._gram.clone()

    @property
    def frobenius2(self) -> float:
        """||A^(t)||_F^2."""
        return self._frob2

    @property
    def recomputations(self) -> int:
        """How many times the algorithm recomputed its subspace."""
        return self._recomputations

    @property
    def trace(self) -> StreamTrace:
        """The per-step record of every row fed so far."""
        if self._trace_cache is None:
            b = self._blocks
            empty = torch.zeros(0, dtype=torch.float64)
            cat = (lambda name: torch.cat([getattr(x, name) for x in b]) if b else empty)
            opt = torch.cat([x.opt for x in b]) if b and all(x.opt is not None for x in b) else None
            self._trace_cache = StreamTrace(self.kind, self._trace_eps(), self.rank, self.dim, cat("frob2"),
                                            cat("cost"), cat("step_recourse"),
                                            torch.cat([x.recomputed for x in b]) if b else torch.zeros(0, dtype=torch.bool),
                                            opt, first_step=1)
        return self._trace_cache

    @property
    def recourse(self) -> float:
        """sum_t ||P_t - P_{t-1}||_F^2 so far (the card's definition; invariant to the choice of basis)."""
        return float(sum(float(b.step_recourse.sum()) for b in self._blocks))

    @property
    def changes(self) -> int:
        """Number of steps at which the subspace moved (by more than rounding)."""
        return int(sum(int(b.changed.sum()) for b in self._blocks))

    def cost(self) -> float:
        """cost_t(V) = ||A^(t) - A^(t) V^T V||_F^2 of the current subspace."""
        return max(0.0, self._frob2 - float(captured_energy(self._basis, self._gram)))

    def guarantee(self) -> Guarantee:
        """The promise at the current step, decided against the exact OPT_t (one d x d eigenvalue problem)."""
        opt = float(tail_energy(torch.linalg.eigvalsh(self._gram), self.rank))
        f = torch.tensor(self._frob2, dtype=torch.float64)
        slack = rounding_slack(f, self.dim, torch.tensor(self._t))
        bound = float(guarantee_bound(self.kind, self._trace_eps(), torch.tensor(opt, dtype=torch.float64), f, slack))
        return Guarantee(self.kind, self._trace_eps(), self._t, self.cost(), opt, self._frob2, bound, self.certified)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(dim={self.dim}, rank={self.rank}, eps={self.eps}, steps={self._t}, "
                f"recourse={self.recourse:.4g}, changes={self.changes})")
