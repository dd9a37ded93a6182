"""LoRA-Pre's alternative start: moment factors set from a rank-r SVD of the first gradient's statistics.

The default start (B = 0, A random) holds no moment at all, so the factored moments build up from zero and need bias
corrections. The method card's alternative starts the factors at the best rank-r fit of the first gradient g_1:

    m_B m_A = [g_1]_r          m_B = U_r sqrt(S_r),  m_A = sqrt(S_r) V_r^T      (rank-r SVD of g_1)
    v_B v_A = [|g_1|]_r        the same for |g_1|, so (v_B v_A)^2 ~ g_1^2

These are estimates of the moments themselves, not of a zero-started EMA: no bias correction applies. The step
reads its bias corrections from the state's step counter, so a warm start sets that counter to `WARM_START_STEP`,
where beta^step (and beta2^(step/2), the surrogate v correction's term) is 0 in double precision for every
beta <= 0.9999: the corrections are exactly 1 and the first update is Adam's with m = g_1, v = g_1^2 where g_1 has
rank <= r. The counter stays exact in float32 for 15 million more steps.
"""

from __future__ import annotations

import torch

FACTOR_INITS = ("zero", "svd")
WARM_START_STEP = float(2**20)


def first_gradient_factor_state(
    p: torch.Tensor, grad: torch.Tensor, rank: int, init_std: float, seed: int, index: int, factor_keys: tuple[str, ...]
) -> dict[str, torch.Tensor]:
    """Warm state of a factored parameter p [rows, cols] from its first gradient `grad` [rows, cols].

    The first (B, A) pair of `factor_keys` is the rank-`rank` SVD fit of `grad`, the second (if any) that of
    |grad|, each split as (U sqrt(S), sqrt(S) V^T). Directions whose singular value is 0 to working precision (a
    gradient of rank < `rank`, or a zero gradient) keep the default start, B column 0 and A row ~ N(0, init_std^2)
    from the same (seed, index) generator, so every r x r Gram matrix the step solves stays invertible. Factors
    are float32 for fp16/bf16 weights; the SVD runs in float64. The step counter is `WARM_START_STEP`.
    """
    rows, cols = p.shape
    dtype = torch.float32 if p.dtype in (torch.float16, torch.bfloat16) else p.dtype
    gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
    g = grad.detach().to(torch.float64)
    state: dict[str, torch.Tensor] = {"step": torch.tensor(WARM_START_STEP, dtype=torch.float32)}
    for k, (b_key, a_key) in enumerate(zip(factor_keys[0::2], factor_keys[1::2])):
        target = g if k == 0 else g.abs()
        u, s, vh = torch.linalg.svd(target.cpu(), full_matrices=False)
        u, s, vh = u[:, :rank], s[:rank], vh[:rank]
        # numerical rank: singular values below the SVD's own rounding level carry no direction
        tol = float(s.max()) * max(rows, cols) * torch.finfo(torch.float64).eps if s.numel() else 0.0
        live = s > tol
        root = s.clamp(min=0).sqrt()
        b = u * root  # [rows, rank]
        a = root[:, None] * vh  # [rank, cols]
        fill = torch.randn(rank, cols, generator=gen, dtype=torch.float32).to(torch.float64) * init_std
        b[:, ~live] = 0.0
        a[~live] = fill[~live]
        state[b_key] = b.to(p.device, dtype)
        state[a_key] = a.to(p.device, dtype)
    return state
