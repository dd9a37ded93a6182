"""WSI, the weight half of WASI (the paper's Algorithm 1): W [O, I] ~ L R with L [O, K] orthonormal and R [K, I].

- `initial_factors(W, eps)`: at t = 0, W = U S V^T (float64 SVD), K the explained-variance rank at eps (fixed from
  then on), L = U_K and R = S_K V_K^T. The paper puts S in L; the authors' code puts it in R, as here: subspace
  iteration needs the orthonormal side.
- `subspace_step(W, L_prev)`: every later step, one warm-started subspace-iteration step on the current dense W:
  R^T <- W^T L_prev, L <- orth(W R^T) (float32 QR), then R <- L^T W. The paper and the authors' code keep the R of
  the first line (built from the previous L), so that L R = L L_prev^T W, which is not W even at full rank once L
  has rotated; the last line projects W on the refreshed subspace instead, so full rank is exact (one more
  O x I x K product).
- `factored_step(L, R)`: the same step on W = L R without forming W (the low-memory variant): W W^T L_0 =
  L (R R^T)(L^T L_0) with L_0 = orth(L), so every product is K x K or thin, O(K^2 (O + I)).
"""

from __future__ import annotations

import torch

from rankwise.errors import InvalidInputError
from rankwise.recipes.wasi.spectrum import explained_variance_rank
from rankwise.recipes.wasi.tucker import orthonormalise


def initial_factors(weight: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(L [O, K] orthonormal, R [K, I]) of the truncated SVD of `weight` [O, I] at explained variance `epsilon`,
    in the weight's dtype (the SVD in float64)."""
    if weight.dim() != 2:
        raise InvalidInputError(f"WSI factorises a weight matrix [out, in], got shape {tuple(weight.shape)}")
    u, s, vh = torch.linalg.svd(weight.detach().double(), full_matrices=False)
    k = explained_variance_rank(s.square(), epsilon)
    return u[:, :k].to(weight.dtype).contiguous(), (s[:k, None] * vh[:k]).to(weight.dtype).contiguous()


@torch.no_grad()
def subspace_step(weight: torch.Tensor, previous_l: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One warm-started subspace-iteration step on the dense `weight` [O, I] from `previous_l` [O, K]: (L, R)."""
    rt = weight.t() @ previous_l  # [I, K]
    l = orthonormalise(weight @ rt)
    return l, l.t() @ weight


@torch.no_grad()
def factored_step(l: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The step of `subspace_step` on W = l @ r (l [O, K], r [K, I]) without forming W: (L orthonormal, R) with
    L R = l r up to rounding.

    With l = Q T (QR), the warm start L_0 = Q spans the column space, and W W^T L_0 = Q (T R R^T T^T), so
    orth(W W^T L_0) = Q Q_2 with Q_2 the Q factor of the K x K matrix T R R^T T^T, and R_new = Q_2^T T R: one thin
    QR and K x K products."""
    q, t = torch.linalg.qr(l.float(), mode="reduced")
    tr = t @ r.float()  # [K, I]: W = Q (T R)
    q2 = torch.linalg.qr(tr @ tr.t(), mode="reduced").Q  # orth of T R R^T T^T
    return (q @ q2).to(l.dtype), (q2.t() @ tr).to(r.dtype)
