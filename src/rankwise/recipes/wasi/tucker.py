"""ASI, the activation half of WASI: a Tucker (HOSVD) factorisation of a layer's 3-D input, refreshed per training
step by one warm-started power step, and the weight gradient computed from the factors without rebuilding A.

An input A [B, N, D] (batch, tokens, features) is stored as A ~ S x_0 U_0 x_1 U_1 x_2 U_2 with a core S [r0, r1, r2]
and orthonormal factors U_m [D_m, r_m]: r0 r1 r2 + B r0 + N r1 + D r2 numbers instead of B N D.

- `hosvd_bases`: the factors of the first step (or of a mode whose size changed): the top-r_m eigenvectors of each
  mode's Gram matrix A_(m) A_(m)^T in float64, r_m from an explained-variance threshold when not given.
- `power_step`: every later step, U_m <- orth(A_(m) (A_(m)^T U_m^prev)) in float32 QR -- the authors' `find_U` with
  `reuse_U` (`hosvd_power_iteration.py`). Their first step starts from a seeded Gaussian; here it is the exact
  truncated eigenbasis (deterministic, and what their TinyLlama path does).
- `tucker_core`, `reconstruct`: S = A x_m U_m^T, and back.
- `gradient_against(g, S, U)`: sum_{b,n} g[b, n, :]^T Ahat[b, n, :] as M [X, r2] with Ahat's gradient being M U_2^T:
  the contraction of the authors' backward (Z1..Z3 in `linear_WASI.py`), ordered so the feature mode comes last
  (cost B N X r0 + r0 r1 r2 N + N X r0 r2, never B N D X).

A 2-D input [B, D] is handled as [B, 1, D] (its token mode has rank 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rankwise.errors import InvalidInputError
from rankwise.recipes.wasi.spectrum import check_epsilon, explained_variance_rank

Ranks = tuple[int, int, int]


def as_3d(a: torch.Tensor) -> torch.Tensor:
    """[B, N, D] as it is, [B, D] as [B, 1, D]; anything else is refused."""
    if a.dim() == 3:
        return a
    if a.dim() == 2:
        return a.unsqueeze(1)
    raise InvalidInputError(f"ASI factorises a linear layer's input [batch, tokens, features] or [batch, features], "
                            f"got a {a.dim()}-D tensor of shape {tuple(a.shape)}")


def _others(mode: int) -> list[int]:
    return [m for m in range(3) if m != mode]


def mode_gram(a: torch.Tensor, mode: int) -> torch.Tensor:
    """A_(m) A_(m)^T [D_m, D_m] in float64 (A_(m): the mode-m unfolding [D_m, prod of the other sizes])."""
    a64 = a.detach().double()
    return torch.tensordot(a64, a64, dims=(_others(mode), _others(mode)))


def hosvd_bases(a: torch.Tensor, ranks: Sequence[int | None] | None = None, epsilon: float | None = None,
                modes: Sequence[int] = (0, 1, 2)) -> tuple[list[torch.Tensor], list[int]]:
    """Truncated-HOSVD factors of `a` [B, N, D] for `modes`: U_m [D_m, r_m] (float32, orthonormal columns, leading
    eigenvectors of the mode-m Gram in float64) and the ranks used. `ranks[m]` fixes r_m (clamped to D_m); where it
    is None the rank is the explained-variance rank of the Gram's eigenvalues at `epsilon`."""
    ranks = list(ranks) if ranks is not None else [None, None, None]
    if len(ranks) != 3:
        raise InvalidInputError(f"a 3-D activation has three Tucker ranks, got {ranks}")
    bases, used = [], []
    for m in modes:
        values, vectors = _leading_eigenpairs(a, m)
        r = ranks[m]
        if r is None:
            if epsilon is None:
                raise InvalidInputError("give Tucker ranks or an explained-variance threshold for them")
            r = explained_variance_rank(values, check_epsilon(epsilon, "activation_epsilon"))
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise InvalidInputError(f"a Tucker rank must be a positive integer, got {r!r}")
        r = min(r, vectors.shape[1])
        bases.append(vectors[:, :r].to(a.dtype).contiguous())
        used.append(r)
    return bases, used


def _leading_eigenpairs(a: torch.Tensor, mode: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(eigenvalues descending, orthonormal eigenvectors [D_m, n]) of A_(m) A_(m)^T, n = min(D_m, P) with P the
    product of the other sizes: from the D_m x D_m Gram, or -- when P < D_m (few tokens of a wide layer) -- from
    the P x P Gram of the other side, U = A_(m) V / sqrt(lambda), re-orthonormalised in float64."""
    d = a.shape[mode]
    p = a.numel() // d
    if p >= d:
        values, vectors = torch.linalg.eigh(mode_gram(a, mode))  # ascending
        return values.flip(0), vectors.flip(1)
    unfolded = a.detach().double().movedim(mode, 0).reshape(d, p)
    values, v = torch.linalg.eigh(unfolded.t() @ unfolded)
    values, v = values.flip(0).clamp_min(0.0), v.flip(1)
    u = unfolded @ v  # columns of norm sqrt(lambda); a zero eigenvalue gives a zero column, which QR completes
    return values, torch.linalg.qr(u).Q


def orthonormalise(m: torch.Tensor) -> torch.Tensor:
    """The Q factor of a reduced QR in float32 (the paper's Gram-Schmidt), returned in m's dtype."""
    return torch.linalg.qr(m.float(), mode="reduced").Q.to(m.dtype)


def power_step(a: torch.Tensor, previous: Sequence[torch.Tensor], modes: Sequence[int] = (0, 1, 2)) -> list[torch.Tensor]:
    """One warm-started subspace-iteration step for each of `modes`: U_m = orth(A_(m) A_(m)^T U_m^prev)."""
    out = []
    for m in modes:
        v = torch.tensordot(a, previous[m], dims=([m], [0]))  # A_(m)^T U: the other two modes, then r_m
        out.append(orthonormalise(torch.tensordot(a, v, dims=(_others(m), [0, 1]))))
    return out


def tucker_core(a: torch.Tensor, bases: Sequence[torch.Tensor]) -> torch.Tensor:
    """S = A x_0 U_0^T x_1 U_1^T x_2 U_2^T [r0, r1, r2]: each contraction takes mode 0 and appends its rank last,
    so after three the core's modes are back in order."""
    s = a
    for u in bases:
        s = torch.tensordot(s, u, dims=([0], [0]))
    return s.contiguous()


def reconstruct(core: torch.Tensor, bases: Sequence[torch.Tensor]) -> torch.Tensor:
    """Ahat = S x_0 U_0 x_1 U_1 x_2 U_2 [D0, D1, D2] (for checks: training never rebuilds A)."""
    a = core
    for u in bases:
        a = torch.tensordot(a, u, dims=([0], [1]))
    return a


def gradient_against(g: torch.Tensor, core: torch.Tensor, bases: Sequence[torch.Tensor]) -> torch.Tensor:
    """M [X, r2] with sum_{b,n} g[b,n,:]^T Ahat[b,n,:] = M @ U_2^T, for g [B, N, X] (an output gradient, or one
    projected to a rank-K space) and the Tucker factors (core [r0, r1, r2], U_0 [B, r0], U_1 [N, r1], U_2 [D, r2])."""
    u0, u1, _ = bases
    z = torch.tensordot(g, u0, dims=([0], [0]))  # [N, X, r0]: the batch mode contracted first (r0 <= B)
    t = torch.tensordot(core, u1, dims=([1], [1]))  # [r0, r2, N]: the token mode expanded
    return torch.einsum("nxa,acn->xc", z, t)


def tucker_numel(shape: Sequence[int], ranks: Sequence[int]) -> int:
    """Numbers a Tucker factorisation of a tensor of `shape` at `ranks` stores: prod r + sum D_m r_m."""
    r0, r1, r2 = ranks
    return r0 * r1 * r2 + sum(d * r for d, r in zip(shape, ranks))


class ActivationSubspace:
    """The per-layer ASI state: fixed Tucker ranks (from `epsilon` on the first batch, or given) and the factors
    of the previous step (the warm start). `compress(a)` -> (core, factors) for this step's input.

    The ranks never change after the first batch (the card's "stable subspace" premise). A batch whose size in some
    mode differs from the previous one (a smaller last batch, another padded length) cannot warm-start that mode:
    its factor is recomputed exactly at the stored rank (clamped to the new size), the others still warm-start."""

    def __init__(self, epsilon: float | None = None, ranks: Sequence[int] | None = None) -> None:
        if ranks is None and epsilon is None:
            raise InvalidInputError("ASI needs an explained-variance threshold or fixed Tucker ranks")
        if ranks is not None:
            ranks = tuple(ranks)
            if len(ranks) != 3 or any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in ranks):
                raise InvalidInputError(f"Tucker ranks are three positive integers (batch, token, feature), got {ranks!r}")
        self.epsilon = None if epsilon is None else check_epsilon(epsilon, "activation_epsilon")
        self.ranks: Ranks | None = ranks  # type: ignore[assignment]
        self.bases: list[torch.Tensor] | None = None
        self.steps = 0  # compressions done (0: the next one is the exact initialisation)

    @torch.no_grad()
    def compress(self, a: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        a = as_3d(a.detach())
        if self.bases is None:
            self.bases, ranks = hosvd_bases(a, self.ranks, self.epsilon)
            self.ranks = self.ranks or tuple(ranks)  # type: ignore[assignment]
        else:
            changed = [m for m in range(3) if self.bases[m].shape[0] != a.shape[m]]
            kept = [m for m in range(3) if m not in changed]
            bases = list(self.bases)
            for m, u in zip(kept, power_step(a, self.bases, kept)):
                bases[m] = u
            if changed:
                for m, u in zip(changed, hosvd_bases(a, self.ranks, modes=changed)[0]):
                    bases[m] = u
            self.bases = bases
        self.steps += 1
        return tucker_core(a, self.bases), list(self.bases)

    def state(self) -> dict[str, torch.Tensor]:
        """What an exact resume needs: the ranks and the current factors."""
        if self.bases is None:
            return {}
        return {"ranks": torch.tensor(self.ranks), **{f"U{m}": u for m, u in enumerate(self.bases)}}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        if not state:
            return
        self.ranks = tuple(int(r) for r in state["ranks"])  # type: ignore[assignment]
        self.bases = [state[f"U{m}"].clone() for m in range(3)]
        self.steps = max(self.steps, 1)

