"""Block quantization: packing, MX/NVFP4 scale rules, torchao bit-for-bit cross-check, shapes, errors."""

import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwise.errors import InvalidInputError, NumericalError, UnknownNameError
from rankwise.quant.block import RECIPES, BlockRecipe, get_recipe, make_recipe, quantize
from rankwise.quant.fake_quant import fake_quantize
from rankwise.quant.formats import E2M1, E8M0, UE4M3, UE5M3
from rankwise.core.packing import pack_nibbles, unpack_nibbles

pytestmark = pytest.mark.method("microscaling-ue5m3")


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 6), st.integers(1, 40), st.integers(0, 2**31 - 1))
def test_property_pack_unpack_round_trip(rows, half, seed):
    codes = torch.randint(0, 16, (rows, 2 * half), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    packed = pack_nibbles(codes)
    assert packed.shape == (rows, half)
    assert torch.equal(unpack_nibbles(packed), codes)
    assert torch.equal(packed & 0x0F, codes[:, 0::2])  # element 2i in the low nibble


def test_pack_rejects_bad_input():
    with pytest.raises(InvalidInputError, match="even"):
        pack_nibbles(torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(InvalidInputError, match="4-bit"):
        pack_nibbles(torch.tensor([16, 0], dtype=torch.uint8))


def test_mx_floor_scale_is_the_ocp_rule():
    x = torch.randn(64, 32) * torch.logspace(-6, 4, 64).unsqueeze(1)
    q = quantize(x, get_recipe("mxfp4"))
    amax = x.abs().amax(dim=1)
    expected = torch.floor(torch.log2(amax.double())) - 2
    assert torch.equal(E8M0.decode(q.scales[:, 0], torch.float64), torch.exp2(expected))
    ratio = amax.double() / q.scale_values()[:, 0]
    assert torch.all((ratio >= 4) & (ratio < 8))


def test_exact_scale_reconstructs_block_max_and_all_zero_blocks_stay_zero():
    x = torch.randn(100, 16)
    x[7] = 0
    xh = fake_quantize(x, get_recipe("fp4-fp32"))
    idx = x.abs().argmax(dim=1, keepdim=True)
    # 6 * fl32(amax / 6), rounded once more to float32: within one ulp of amax, i.e. 2^-23 relative
    assert torch.allclose(xh.gather(1, idx), x.gather(1, idx), rtol=2**-23, atol=0)
    for name in RECIPES:
        out = fake_quantize(x, get_recipe(name))
        assert torch.isfinite(out).all() and torch.all(out[7] == 0), name


def test_ue4m3_flushes_blocks_below_half_its_smallest_subnormal():
    # amax / 6 = 2^-10 exactly: the scale ties to the even code 0 and the whole block becomes 0 (card invariant);
    # UE5M3 keeps it, and so does a per-tensor scale.
    x = torch.tensor([[6 * 2.0**-10, 1e-4] + [0.0] * 14, [1.0] + [0.5] * 15])
    flushed = fake_quantize(x, get_recipe("fp4-ue4m3"))
    assert torch.all(flushed[0] == 0) and torch.all(flushed[1] > 0)
    assert fake_quantize(x, get_recipe("fp4-ue5m3"))[0, 0] == 6 * 2.0**-10
    assert fake_quantize(x, get_recipe("fp4-ue4m3-s"))[0, 0] > 0
    assert quantize(x, get_recipe("fp4-ue4m3")).scales[0].item() == 0


def test_global_scale_maps_the_largest_block_onto_the_scale_max():
    x = torch.randn(8, 64) * 1e-3
    for name, fmt in (("fp4-ue4m3-s", UE4M3), ("fp4-ue5m3-s", UE5M3)):
        q = quantize(x, get_recipe(name))
        # amax / (6 max) with an exact float32 divisor: one float32 rounding, 2^-24 relative; 2x margin
        assert math.isclose(q.global_scale.item(), x.abs().max().item() / (6 * fmt.max), rel_tol=2.0**-23)
        assert q.scale_values().max().item() == fmt.max


def test_non_divisible_shapes_raise_or_pad():
    x = torch.randn(4, 40)
    with pytest.raises(InvalidInputError, match="multiple of the block size"):
        quantize(x, get_recipe("fp4-ue5m3"))
    q = quantize(x, get_recipe("fp4-ue5m3"), pad=True)
    assert q.codes.shape == (4, 48) and q.scales.shape == (4, 3)
    assert q.dequantize().shape == x.shape
    # padding zeros do not change the blocks that hold real values
    assert torch.equal(q.dequantize()[:, :32], fake_quantize(x[:, :32], get_recipe("fp4-ue5m3")))


@pytest.mark.parametrize("bad", [torch.tensor([[1.0, math.nan] * 8]), torch.tensor([[math.inf] + [0.0] * 15])])
def test_non_finite_input_raises(bad):
    with pytest.raises(NumericalError, match="NaN/Inf"):
        quantize(bad, get_recipe("nvfp4"))


def test_recipe_validation():
    for k in (1, 7, 2048):
        with pytest.raises(InvalidInputError, match="block size"):
            get_recipe("fp4-ue5m3", k)
    with pytest.raises(InvalidInputError, match="rule"):
        BlockRecipe("bad", E2M1, UE5M3, 16, scale_rule="floor")
    with pytest.raises(UnknownNameError):
        get_recipe("fp5")
    with pytest.raises(InvalidInputError):
        quantize(torch.tensor(1.0), get_recipe("mxfp4"))
    r = make_recipe("fp4", "ue5m3", 8)
    assert (r.element, r.scale, r.block_size, r.global_scale) == (E2M1, UE5M3, 8, False)
    assert make_recipe("fp4", "e8m0", 32).scale_rule == "floor"


@pytest.mark.parametrize("k", [8, 12, 16, 24, 32, 64, 96, 128])
@pytest.mark.parametrize("name", ["mxfp4", "fp4-ue4m3", "fp4-ue4m3-s", "fp4-ue5m3", "fp4-fp32"])
def test_any_block_size_beats_nothing_and_bits(k, name):
    x = torch.randn(12, 384)
    q = quantize(x, get_recipe(name, k))
    assert q.scales.shape == (12, 384 // k)
    rel = ((q.dequantize() - x) ** 2).mean() / (x**2).mean()
    assert rel < 0.05  # FP4 with any sane scale keeps the relative error near 1e-2


# ---- torchao cross-check ------------------------------------------------------------------------------------------

torchao_mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale


def adversarial(k: int, rows: int = 64, seed: int = 0) -> torch.Tensor:
    """Random rows over 12 decades plus rows made of exact E2M1 rounding ties, scale ties and saturation edges."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 4 * k, generator=g) * torch.logspace(-9, 3, rows).unsqueeze(1)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0, 7.9, 4.0, 0.0])
    tie_rows = []
    for scale in (1.0, 2.0**-5, 3 * 2.0**-8, 448 / 4, 13.0):
        row = ties.repeat(4 * k // len(ties) + 1)[: 4 * k] * scale
        tie_rows += [row, -row, row * (1 + 2**-23), row * (1 - 2**-24)]
    # UE4M3 scale midpoints: amax / 6 exactly between two representable scales
    mids = (UE4M3.magnitudes[9:100] + UE4M3.magnitudes[8:99]) / 2
    tie_rows.append(torch.cat([mids.float() * 6, torch.zeros(4 * k)])[: 4 * k])
    return torch.cat([x, torch.stack(tie_rows)]).contiguous()


@pytest.mark.parametrize("k", [16, 32, 64])
@pytest.mark.parametrize("rule", ["floor", "ceil", "even", "rceil"])
def test_mxfp4_equals_torchao_bit_for_bit(k, rule):
    mode = {"floor": ScaleCalculationMode.FLOOR, "ceil": ScaleCalculationMode.CEIL,
            "even": ScaleCalculationMode.EVEN, "rceil": ScaleCalculationMode.RCEIL}[rule]
    x = adversarial(k)
    # torchao divides by max(scale, 2^-126) and its RCEIL uses a float log2; both only matter for blocks with
    # amax < 2^-124 or amax / 6 within an ulp above a power of two, which these inputs avoid (documented).
    scale, data = torchao_mx.to_mx(x, torch.float4_e2m1fn_x2, k, mode)
    q = quantize(x, get_recipe(f"mxfp4-{rule}" if rule != "floor" else "mxfp4", k))
    assert torch.equal(q.scales, scale.view(torch.uint8))
    assert torch.equal(pack_nibbles(q.codes), data.view(torch.uint8))


def test_mxfp8_equals_torchao_bit_for_bit():
    x = adversarial(32)
    scale, data = torchao_mx.to_mx(x, torch.float8_e4m3fn, 32, ScaleCalculationMode.FLOOR)
    q = quantize(x, get_recipe("mxfp8"))
    assert torch.equal(q.scales, scale.view(torch.uint8)) and torch.equal(q.codes, data.view(torch.uint8))


def test_nvfp4_equals_torchao_bit_for_bit():
    x = adversarial(16)
    s = per_tensor_amax_to_scale(x.abs().max())
    scale, data = nvfp4_quantize(x, 16, s)
    q = quantize(x, get_recipe("nvfp4"))
    assert q.global_scale.item() == s.item()
    assert torch.equal(q.scales, scale.view(torch.uint8)) and torch.equal(pack_nibbles(q.codes), data)


def test_single_level_nvfp4_matches_torchao_where_no_scale_underflows():
    x = adversarial(16)
    scale, data = nvfp4_quantize(x, 16, None)  # torchao clamps every scale up to 2^-6 (never subnormal or zero)
    q = quantize(x, get_recipe("fp4-ue4m3"))
    s_star = x.reshape(x.size(0), -1, 16).abs().amax(-1) / 6
    normal = s_star >= 2.0**-6
    assert normal.any() and (~normal).any()
    assert torch.equal(q.scales[normal], scale.view(torch.uint8)[normal])
    codes = q.codes.reshape(x.size(0), -1, 16)
    ref = unpack_nibbles(data).reshape(x.size(0), -1, 16)
    assert torch.equal(codes[normal], ref[normal])
    # with the clamp switched on, every block agrees
    from dataclasses import replace

    q2 = quantize(x, replace(get_recipe("fp4-ue4m3"), clamp_scale_to_min_normal=True))
    assert torch.equal(q2.scales, scale.view(torch.uint8)) and torch.equal(pack_nibbles(q2.codes), data)
