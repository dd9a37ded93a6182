"""LoRA-Pre's batched step (same-shape matrices updated together) equals the per-matrix reference step.

The batched path regroups the same arithmetic (addmm instead of matmul + scale + add, hypot instead of
square + add + sqrt, stacked r x r solves), so the two agree up to float rounding only. They are compared in float64,
where that rounding is ~1e-16 relative per operation: after a few steps through well-conditioned r x r solves
(ridge-regularised Grams of random factors) it stays far below the 1e-9 tolerance, while any real difference in the
update rule (a missing bias correction, a wrong factor order) moves the weights by ~lr = 1e-2 relative.
"""

import pytest
import torch
from torch import nn

from rankwise.optim import LoRAPre, LoRAPreMuon
from rankwise.optim.low_rank_regression import newton_factor_step_, newton_factor_steps_

pytestmark = pytest.mark.method("lora-pre")

SHAPES = [(7, 5), (7, 5), (7, 5), (4, 9), (4, 9), (6, 6)]  # three same-shape buckets, one of a single matrix


def _params(dtype: torch.dtype) -> list[nn.Parameter]:
    gen = torch.Generator().manual_seed(0)
    return [nn.Parameter(torch.randn(s, generator=gen, dtype=torch.float64).to(dtype)) for s in SHAPES] + [
        nn.Parameter(torch.randn(5, generator=gen, dtype=torch.float64).to(dtype))]  # a vector: the AdamW path


def _grads(step: int, dtype: torch.dtype) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return [torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for s in SHAPES + [(5,)]]


def _run(cls, batched: bool, dtype: torch.dtype, steps: int = 6, block_numel: int | None = None, **kwargs) -> tuple[list[torch.Tensor], dict]:
    params = _params(dtype)
    opt = cls(params, **kwargs)
    opt.batched_step = batched
    if block_numel is not None:
        opt.block_numel = block_numel
    for t in range(steps):
        for i, (p, g) in enumerate(zip(params, _grads(t, dtype))):
            # matrix 1 misses the gradient of step 2: its step count then lags the others of its shape
            p.grad = None if (i == 1 and t == 2) else g
        opt.step()
    return [p.detach().clone() for p in params], opt.state_dict()["state"]


VARIANTS = {
    "adam": (LoRAPre, dict(lr=1e-2, rank=3, weight_decay=0.1)),
    "adam-updated-factors": (LoRAPre, dict(lr=1e-2, rank=3, use_updated_factors=True)),
    "adam-adam-correction": (LoRAPre, dict(lr=1e-2, rank=2, v_bias_correction="adam")),
    "muon": (LoRAPreMuon, dict(lr=0.02, rank=3, weight_decay=0.01)),
    "muon-nesterov-updated": (LoRAPreMuon, dict(lr=0.02, rank=2, nesterov=True, use_updated_factors=True)),
}


# block_numel 10: the streamed step walks (7, 5) matrices in row blocks of 2 (the last one partial), (4, 9) and
# (6, 6) ones row by row, so the per-block regression sums and updates are exercised; None: one block per matrix.
@pytest.mark.parametrize("block_numel", [None, 10])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_batched_step_equals_reference_step_in_float64(variant, block_numel):
    cls, kwargs = VARIANTS[variant]
    ref, ref_state = _run(cls, False, torch.float64, **kwargs)
    fast, fast_state = _run(cls, True, torch.float64, block_numel=block_numel, **kwargs)
    start = _params(torch.float64)
    for p, q, p0 in zip(ref, fast, start):
        assert not torch.equal(p, p0)  # the steps moved every weight: the comparison is not vacuous
        torch.testing.assert_close(q, p, rtol=1e-9, atol=1e-12)
    for k, entry in ref_state.items():
        for name, t in entry.items():
            torch.testing.assert_close(fast_state[k][name], t, rtol=1e-9, atol=1e-12, msg=f"{k}/{name}")


def test_batched_step_with_bf16_weights_matches_reference():
    # Gradients are fixed, not computed from the weights, so the float32 factors see the same targets on both paths
    # and agree to float32 rounding; each bf16 weight can differ by at most one rounding (2^-8 relative) per step.
    steps = 4
    ref, ref_state = _run(LoRAPre, False, torch.bfloat16, steps=steps, lr=1e-2, rank=3)
    fast, fast_state = _run(LoRAPre, True, torch.bfloat16, steps=steps, block_numel=10, lr=1e-2, rank=3)
    for p, q in zip(ref, fast):
        assert q.dtype == torch.bfloat16
        torch.testing.assert_close(q.float(), p.float(), rtol=steps * 2**-8, atol=1e-6)
    assert fast_state[0]["m_B"].dtype == torch.float32
    for k, entry in ref_state.items():
        for name, t in entry.items():
            torch.testing.assert_close(fast_state[k][name], t, rtol=1e-4, atol=1e-6, msg=f"{k}/{name}")


def test_batched_newton_step_equals_per_matrix_steps():
    gen = torch.Generator().manual_seed(3)
    n, p, q, r = 4, 9, 7, 3
    b = torch.randn(n, p, r, generator=gen, dtype=torch.float64)
    a = torch.randn(n, r, q, generator=gen, dtype=torch.float64)
    targets = [torch.randn(p, q, generator=gen, dtype=torch.float64) for _ in range(n)]
    ref = [(b[i].clone(), a[i].clone()) for i in range(n)]
    for (bi, ai), t in zip(ref, targets):
        newton_factor_step_(bi, ai, t / 0.3, 0.2)
    newton_factor_steps_(b, a, targets, 0.2, target_scale=1 / 0.3)
    for i, (bi, ai) in enumerate(ref):
        torch.testing.assert_close(b[i], bi, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(a[i], ai, rtol=1e-10, atol=1e-12)
