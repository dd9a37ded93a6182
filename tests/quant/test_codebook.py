"""Codebook quantizers (INT-b absmax, NormalFloat NF-b, double quantization): grids, idempotence, storage, errors."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwise.errors import InvalidInputError, NumericalError, UnknownNameError
from rankwise.quant.codebook import (RECIPES, CodebookRecipe, codebook_levels, fake_quantize_codebook, int_levels,
                                     nearest_level, nf_levels, quantize_codebook, storage_bits_per_weight)

pytestmark = pytest.mark.method("portable-adapter", "coa-lora")

# bitsandbytes' NF4 table (QLoRA, Appendix E), to the printed precision.
NF4_QLORA = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
             -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
             0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0]


def test_nf4_levels_are_qloras():
    # bitsandbytes stores float32 levels built from the offset rounded to 0.9677083: agreement to ~2e-7
    assert torch.allclose(nf_levels(4), torch.tensor(NF4_QLORA, dtype=torch.float64), atol=5e-7, rtol=0)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_nf_levels_asymmetric_zero(bits):
    levels = nf_levels(bits)
    assert levels.numel() == 2 ** bits and torch.all(levels[1:] > levels[:-1])
    assert levels[0] == -1 and levels[-1] == 1 and (levels == 0).sum() == 1
    assert (levels > 0).sum() == 2 ** (bits - 1) and (levels < 0).sum() == 2 ** (bits - 1) - 1


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_int_levels_symmetric(bits):
    levels = int_levels(bits)
    qmax = 2 ** (bits - 1) - 1
    assert levels.numel() == 2 * qmax + 1 and torch.equal(levels, -levels.flip(0))
    assert torch.allclose(levels * qmax, torch.arange(-qmax, qmax + 1, dtype=torch.float64))


def _recipes():
    extra = [CodebookRecipe("int", 4, 32, scale_bits=8, scale_block_size=16, scale_dtype="bf16"),
             CodebookRecipe("nf", 8, 16, scale_dtype="fp16"), CodebookRecipe("nf", 3, 24, scale_bits=4, scale_block_size=8),
             CodebookRecipe("int", 2, None, scale_dtype="bf16")]
    return list(RECIPES.values()) + extra


@pytest.mark.parametrize("recipe", _recipes(), ids=lambda r: r.name)
def test_values_on_grid_and_idempotent(recipe):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(24, 100, generator=g) * torch.logspace(-3, 1, 24).unsqueeze(1)
    w[3] = 0  # an all-zero row stays zero
    q = quantize_codebook(w, recipe)
    w_hat = q.dequantize()
    assert w_hat.shape == w.shape and w_hat.dtype == torch.float32 and torch.all(w_hat[3] == 0)
    # on the grid: every value is scale * level (in float64, before the single rounding to float32)
    k = recipe.block_size or w.shape[1]
    levels = codebook_levels(recipe.kind, recipe.bits)
    padded = torch.nn.functional.pad(w_hat.double(), (0, (-w.shape[1]) % k)).reshape(24, -1, k)
    scales = q.scales.double().unsqueeze(-1)
    ratio = torch.where(scales > 0, padded / scales.clamp_min(1e-300), torch.zeros_like(padded))
    nearest = levels[nearest_level(ratio, levels)]
    # |level| <= 1 and one float32 rounding of scale * level: |ratio - level| <= 2^-24; 4x margin
    assert torch.allclose(ratio, nearest, atol=2 ** -22, rtol=0)
    # idempotent: same codes, scales and values, bit for bit
    q2 = quantize_codebook(w_hat, recipe)
    assert torch.equal(q2.codes, q.codes) and torch.equal(q2.scales, q.scales)
    assert torch.equal(q2.dequantize(), w_hat)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(_recipes()), st.integers(1, 5), st.integers(1, 70), st.integers(0, 2 ** 31 - 1),
       st.floats(-12, 6))
def test_property_idempotent_any_shape_and_magnitude(recipe, rows, cols, seed, log2_scale):
    w = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 2.0 ** log2_scale
    w_hat = fake_quantize_codebook(w, recipe)
    assert torch.equal(fake_quantize_codebook(w_hat, recipe), w_hat)


def test_int_is_rounded_absmax_quantization():
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(1))
    w_hat = fake_quantize_codebook(w, CodebookRecipe("int", 4, 32))
    blocks = w.double().reshape(16, 2, 32)
    step = blocks.abs().amax(-1, keepdim=True) / 7
    expected = (torch.round(blocks / step) * step).reshape(16, 64)
    # round() ties to even and bucketize ties low; random data has no ties. w_hat is the float32 rounding (2^-24
    # relative) of a value at most its block's absmax; 2x margin, per block
    bound = (2.0**-23 * 7 * step).expand(-1, -1, 32).reshape(16, 64)
    assert ((w_hat.double() - expected).abs() <= bound).all()


def test_int8_per_channel_error_below_int4_below_int3():
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(2))
    errors = [float((fake_quantize_codebook(w, RECIPES[n]) - w).pow(2).mean()) for n in ("int8", "int4", "int3")]
    assert errors[0] < errors[1] < errors[2]


def test_nf4_beats_int4_on_gaussian_weights():
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(3))
    nf = float((fake_quantize_codebook(w, CodebookRecipe("nf", 4, 64)) - w).pow(2).mean())
    it = float((fake_quantize_codebook(w, CodebookRecipe("int", 4, 64)) - w).pow(2).mean())
    assert nf < it


def test_double_quantization_costs_little_and_stores_scales_on_a_b1_grid():
    w = torch.randn(128, 512, generator=torch.Generator().manual_seed(4))
    plain = fake_quantize_codebook(w, RECIPES["nf4"])
    q = quantize_codebook(w, RECIPES["nf4-dq"])
    e_plain, e_dq = float((plain - w).pow(2).mean()), float((q.dequantize() - w).pow(2).mean())
    assert abs(e_dq - e_plain) < 0.05 * e_plain  # rounding scales down to 8 bits moves the error by < 5%
    assert q.scale_codes.numel() == 128 * 512 // 64 and q.second_scales.numel() == math.ceil(1024 / 256)
    assert int(q.scale_codes.min()) >= 1 and int(q.scale_codes.max()) == 255
    second = q.second_scales.double().repeat_interleave(256)[: q.scale_codes.numel()]
    # the stored scales are code / 255 * second in float64, rounded once to float32 (2^-24 relative); 2x margin
    assert torch.allclose(q.scales.reshape(-1).double(), q.scale_codes.double() / 255 * second, rtol=2 ** -23, atol=0)


def test_tiny_blocks_are_not_flushed_by_double_quantization():
    w = torch.randn(4, 64, generator=torch.Generator().manual_seed(5))
    w[1] *= 1 / 400  # its scale is below 1/255 of its group's largest: an 8-bit code rounded down would be 0
    recipe = CodebookRecipe("nf", 4, 64, scale_bits=8, scale_block_size=4)
    q = quantize_codebook(w, recipe)
    assert q.scale_codes[1] == 1 and q.dequantize()[1].abs().amax() > 0
    w[1] *= 1e-4  # so small that every weight rounds to 0: the block then stores scale 0
    q = quantize_codebook(w, recipe)
    assert q.scale_codes[1] == 0 and torch.all(q.dequantize()[1] == 0)


def test_storage_formula():
    assert storage_bits_per_weight(4, 64) == 4.5
    assert storage_bits_per_weight(4, 64, 8, 256) == pytest.approx(4 + 8 / 64 + 32 / (64 * 256))  # QLoRA's 4.127
    assert RECIPES["nf4-dq"].bits_per_weight() == pytest.approx(4.127, abs=1e-3)
    assert CodebookRecipe("int", 4, 32, scale_dtype="fp16").bits_per_weight() == 4.5
    assert RECIPES["int8"].bits_per_weight(in_features=576) == pytest.approx(8 + 32 / 576)
    with pytest.raises(InvalidInputError, match="in_features"):
        RECIPES["int8"].bits_per_weight()


def test_bad_input_raises_clear_errors():
    with pytest.raises(InvalidInputError, match="bits"):
        CodebookRecipe("nf", 5)
    with pytest.raises(InvalidInputError, match="bits"):
        CodebookRecipe("int", 1)
    with pytest.raises(UnknownNameError, match="kind"):
        CodebookRecipe("fp", 4)
    with pytest.raises(InvalidInputError, match="block_size"):
        CodebookRecipe("int", 4, 0)
    with pytest.raises(InvalidInputError, match="scale_dtype"):
        CodebookRecipe("int", 4, 32, scale_dtype="fp8")
    with pytest.raises(UnknownNameError, match="known"):
        quantize_codebook(torch.randn(2, 4), "nf5")
    with pytest.raises(NumericalError, match="NaN"):
        quantize_codebook(torch.tensor([[1.0, float("nan")]]), "nf4")
    with pytest.raises(InvalidInputError, match="floating"):
        quantize_codebook(torch.ones(2, 4, dtype=torch.int32), "nf4")
    with pytest.raises(InvalidInputError, match="non-empty"):
        quantize_codebook(torch.ones(0, 4), "nf4")
