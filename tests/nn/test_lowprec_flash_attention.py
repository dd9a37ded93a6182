"""The card's invariants of the tiled flash attention with emulated bf16 rounding, and its bad input."""

import pytest
import torch
import torch.nn.functional as F

from rankwise.errors import RankwiseError
from rankwise.nn.lowprec_flash_attention import (BiasCase, FlashAttention, FlashConfig, bf16_round,
                                                 bf16_round_stochastic, fixed_row_max, flash_attention, flash_forward,
                                                 measure_bias, synthetic_rows)

pytestmark = pytest.mark.method("lowprec-flash-attention")


def _qkv(dtype=torch.float32, tq=13, tk=13, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, 3, tq, 8, generator=g, dtype=dtype), torch.randn(2, 3, tk, 8, generator=g, dtype=dtype),
            torch.randn(2, 3, tk, 8, generator=g, dtype=dtype))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tiles", [(4, 3), (64, 64), (1, 13)])
def test_fp32_equals_sdpa(causal, tiles):
    q, k, v = _qkv()
    out = flash_attention(q, k, v, causal=causal, tile_q=tiles[0], tile_k=tiles[1])
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("fix", [False, True])
def test_backward_equals_autograd_float64(causal, fix):
    q, k, v = (t.requires_grad_() for t in _qkv(torch.float64, tq=9, tk=11 if not causal else 12))
    do = torch.randn(2, 3, 9, 8, dtype=torch.float64)
    out = flash_attention(q, k, v, causal=causal, fix=fix, tile_q=4, tile_k=5)
    grads = torch.autograd.grad(out, (q, k, v), do)
    mask = None
    if causal:
        mask = torch.ones(9, k.shape[-2], dtype=torch.bool).tril(k.shape[-2] - 9)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
    for g, r in zip(grads, torch.autograd.grad(ref, (q, k, v), do)):
        torch.testing.assert_close(g, r, atol=1e-11, rtol=1e-11)


def test_fix_leaves_exact_arithmetic_unchanged():
    q, k, v = _qkv(torch.float64)
    k[..., 3, :] = k[..., 5, :]  # ties at the row max in some rows
    q = q * 3  # large positive maxima: the β·m branch
    base = flash_forward(q, k, v, FlashConfig(tile_q=4, tile_k=6))
    fixed = flash_forward(q, k, v, FlashConfig(fix=True, tile_q=4, tile_k=6))
    torch.testing.assert_close(fixed[0], base[0], atol=1e-12, rtol=0)
    torch.testing.assert_close(fixed[1], base[1], atol=1e-12, rtol=0)
    q32, k32, v32 = (t.float() for t in (q, k, v))
    torch.testing.assert_close(flash_attention(q32, k32, v32, fix=True), flash_attention(q32, k32, v32),
                               atol=1e-5, rtol=1e-5)


def test_fix_removes_unit_probabilities():
    s = torch.tensor([[2.0, 2.0, -5.0], [-1.0, -1.0, -3.0], [1.0, 0.0, -2.0]])
    m = fixed_row_max(s, FlashConfig(fix=True))
    assert m.tolist() == [4.0, 0.0, 1.0]  # β·m for a positive tie, 0 for a negative one, unchanged without a tie
    p = torch.exp(s - m.unsqueeze(-1))
    assert not (p[:2] == 1.0).any() and (p[2] == 1.0).any()


def test_emulated_rounding_is_bf16_round_to_nearest_even():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10**6, generator=g) * torch.exp(8 * torch.randn(10**6, generator=g))
    x = torch.cat([x, torch.tensor([1.0 + 2**-8, 1.0 + 3 * 2**-8, -(1.0 + 2**-8), 3.4e38, float("inf"), 0.0])])
    assert torch.equal(bf16_round(x), x.to(torch.bfloat16).float())
    assert torch.isnan(bf16_round(torch.tensor([float("nan")]))).all()
    y = torch.full((200_000,), 1.0 + 2**-9)  # a quarter of the way to the next bf16 value
    sr = bf16_round_stochastic(y, torch.Generator().manual_seed(1))
    assert set(sr.unique().tolist()) == {1.0, 1.0 + 2**-7}
    assert abs(float(sr.double().mean()) - (1.0 + 2**-9)) < 2e-5  # unbiased


def test_bias_present_without_fix_and_reduced_with_it():
    s, v = synthetic_rows(BiasCase(gap=(12.0, 20.0)), 4096, torch.Generator().manual_seed(0))
    plain = measure_bias(s, v, FlashConfig("bf16", tile_q=256, tile_k=256))
    fixed = measure_bias(s, v, FlashConfig("bf16", fix=True, tile_q=256, tile_k=256))
    assert plain.magnitude_bias_u > 0.1 and plain.t_stat > 5
    assert abs(fixed.magnitude_bias_u) < plain.magnitude_bias_u / 3


def test_too_large_beta_is_clamped_not_nan():
    q, k, v = _qkv()
    k[..., 1, :] = k[..., 0, :]
    out = flash_attention(q * 50, k, v, precision="bf16", fix=True, beta=1e4)
    assert torch.isfinite(out).all()


def test_module_and_qk_norm_shapes():
    q, k, v = _qkv()
    layer = FlashAttention(8, num_heads=3, qk_norm=True, precision="bf16", fix=True)
    assert layer(q, k, v).shape == q.shape


@pytest.mark.parametrize("make, match", [
    (lambda q, k, v: flash_attention(q[0], k[0], v[0]), "rank 4"),
    (lambda q, k, v: flash_attention(q, k, v[..., :5, :]), "same shape"),
    (lambda q, k, v: flash_attention(q, k[..., :4], v[..., :4]), "head_dim"),
    (lambda q, k, v: flash_attention(q, k, v, tile_q=0), "tile_q"),
    (lambda q, k, v: flash_attention(q, k, v, tile_k=-2), "tile_k"),
    (lambda q, k, v: flash_attention(q.index_fill(2, torch.tensor([0]), float("nan")), k, v), "NaN"),
    (lambda q, k, v: flash_attention(q, k, v, beta=1.0), "beta"),
    (lambda q, k, v: flash_attention(q, k, v, precision="fp8"), "precision"),
    (lambda q, k, v: FlashAttention(8)(q, k, v.index_fill(2, torch.tensor([1]), float("nan"))), "NaN"),
])
def test_bad_input_refused(make, match):
    with pytest.raises(RankwiseError, match=match):
        make(*_qkv())
