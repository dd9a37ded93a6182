"""Exact minifloat codecs: every code round-trips, ties go to even, saturation, specials, subnormals."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwise.errors import InvalidInputError, NumericalError, UnknownNameError
from rankwise.quant.formats import E2M1, E4M3, E5M2, E8M0, FORMATS, UE4M3, UE5M3, UE5M3_IEEE, UE5M3_NO_SPECIALS, get_format

pytestmark = pytest.mark.method("microscaling-ue5m3")

ALL = list(FORMATS.values())


def finite_codes(fmt):
    return [c for c in range(fmt.num_codes) if math.isfinite(float(fmt.values[c]))]


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_every_finite_code_round_trips(fmt):
    codes = torch.tensor(finite_codes(fmt))
    values = fmt.decode(codes, torch.float64)
    for encode in (fmt.encode, fmt.encode_reference):
        back = encode(values).long()
        assert torch.equal(back, codes), fmt.name  # -0 keeps its sign bit, so even the zero pair round-trips
    # float32 inputs too (every value of these formats is exact in float32)
    assert torch.equal(fmt.encode(fmt.decode(codes)).long(), codes)


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_decode_is_monotone_in_the_code(fmt):
    mags = fmt.magnitudes[: fmt.max_code + 1]
    assert torch.all(mags[1:] > mags[:-1])


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_midpoints_round_to_even_and_are_exact_in_float32(fmt):
    mags = fmt.magnitudes[: fmt.max_code + 1]
    mids = (mags[1:] + mags[:-1]) / 2
    assert torch.equal(mids.float().double(), mids)
    got = fmt.encode(mids).long()
    expect_up = torch.arange(len(mids)) % 2 == 1 if fmt.mbits > 0 else torch.ones(len(mids), dtype=torch.bool)
    expected = torch.arange(len(mids)) + expect_up.long()
    assert torch.equal(got, expected)
    assert torch.equal(fmt.encode_reference(mids).long(), expected)


def test_e2m1_grid_and_card_ties():
    assert E2M1.values[:8].tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert E2M1.round(ties).tolist() == [0, 1, 1, 2, 2, 4, 4]
    assert E2M1.round(-ties).tolist() == [-0.0, -1, -1, -2, -2, -4, -4]


def test_table_of_maxima_and_minima():
    assert (E2M1.max, E4M3.max, E5M2.max, UE4M3.max) == (6, 448, 57344, 448)
    assert E8M0.max == 2.0**127 and E8M0.min_positive == 2.0**-127
    assert (UE5M3.max, UE5M3_IEEE.max, UE5M3_NO_SPECIALS.max) == (114688, 61440, 122880)
    assert UE5M3.min_positive == 2.0**-17 and UE4M3.min_positive == 2.0**-9
    assert UE5M3.min_normal == 2.0**-14 and UE4M3.min_normal == 2.0**-6
    assert (E2M1.emax, E4M3.emax, E5M2.emax) == (2, 8, 15)


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_saturation_and_non_saturating_overflow(fmt):
    big = torch.tensor([fmt.max * 1.6, fmt.max * 1000, math.inf])  # beyond max + half a step
    assert torch.all(fmt.round(big) == fmt.max)
    if fmt.inf_code is None and fmt.nan_code is None:
        with pytest.raises(InvalidInputError, match="saturate"):
            fmt.encode(big, saturate=False)
    else:
        out = fmt.decode(fmt.encode(big, saturate=False))
        assert not torch.isfinite(out).any()
        assert fmt.decode(fmt.encode(torch.tensor([fmt.max]), saturate=False)).item() == fmt.max


def test_nan_maps_to_the_nan_code_or_raises():
    for fmt in (E4M3, E5M2, E8M0, UE4M3, UE5M3):
        assert torch.isnan(fmt.decode(fmt.encode(torch.tensor([math.nan])))).all()
    for fmt in (E2M1, UE5M3_NO_SPECIALS):
        with pytest.raises(NumericalError, match="NaN"):
            fmt.encode(torch.tensor([1.0, math.nan]))


def test_subnormals_and_underflow():
    # UE4M3: 2^-10 is half the smallest subnormal: the tie goes to the even code 0; just above goes to 2^-9.
    assert UE4M3.round(torch.tensor([2.0**-10], dtype=torch.float64)).item() == 0
    assert UE4M3.round(torch.tensor([2.0**-10 * 1.0001], dtype=torch.float64)).item() == 2.0**-9
    assert UE5M3.round(torch.tensor([2.0**-17, 3 * 2.0**-17, 2.0**-18], dtype=torch.float64)).tolist() == [2.0**-17, 3 * 2.0**-17, 0]
    # Subnormal spacing is uniform: 5 * 2^-9 is representable in UE4M3 (E = 0, M = 5).
    assert UE4M3.encode(torch.tensor([5 * 2.0**-9])).item() == 5
    # E8M0 has no zero: 0 and tiny values encode to its smallest value 2^-127.
    assert E8M0.decode(E8M0.encode(torch.tensor([0.0, 1e-45]))).tolist() == [2.0**-127, 2.0**-127]


def test_fp8_encodings_equal_torch_casts():
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(20000, generator=g) * s for s in (1e-4, 1e-2, 1, 100, 1e4)])
    x = torch.cat([x, torch.tensor([0.0, -0.0, 464.0, 480.0, -470.0, 61440.0, 60000.0, 1e6, math.inf, -math.inf])])
    x = torch.cat([x, E4M3.values.float(), E5M2.values.float()])
    finite = torch.isfinite(x)
    # torch's E4M3 cast saturates (Inf too); its E5M2 cast is IEEE (overflow -> Inf).
    assert torch.equal(E4M3.encode(x[finite | torch.isinf(x)], saturate=True),
                       x[finite | torch.isinf(x)].to(torch.float8_e4m3fn).view(torch.uint8))
    y = x[~torch.isnan(x)]
    assert torch.equal(E5M2.encode(y, saturate=False), y.to(torch.float8_e5m2).view(torch.uint8))
    pos = x[(x > 0) & finite]
    assert torch.equal(E8M0.encode(pos.clamp(2.0**-127, 2.0**127)), pos.clamp(2.0**-127, 2.0**127).to(torch.float8_e8m0fnu).view(torch.uint8))


def test_unsigned_formats_reject_negative_values():
    with pytest.raises(InvalidInputError, match="unsigned"):
        UE5M3.encode(torch.tensor([1.0, -2.0]))
    assert UE5M3.encode(torch.tensor([-0.0])).item() == 0


def test_bad_codes_and_names():
    with pytest.raises(InvalidInputError):
        E2M1.decode(torch.tensor([16]))
    with pytest.raises(InvalidInputError):
        E2M1.decode(torch.tensor([1.0]))
    with pytest.raises(UnknownNameError):
        get_format("e3m4")
    assert get_format("fp4") is E2M1 and get_format("UE5M3") is UE5M3


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(ALL), st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=1, max_size=64))
def test_property_fast_and_reference_encoders_agree_and_round_to_nearest(fmt, values):
    x = torch.tensor(values, dtype=torch.float32)
    if not fmt.signed:
        x = x.abs()
    codes = fmt.encode(x)
    assert torch.equal(codes, fmt.encode_reference(x))
    got = fmt.decode(codes, torch.float64)
    # nearest: no finite value of the format is strictly closer (saturated values excepted)
    grid = fmt.values[torch.isfinite(fmt.values)]
    best = (x.double().unsqueeze(1) - grid.unsqueeze(0)).abs().min(dim=1).values
    inside = x.double().abs() <= fmt.max
    assert torch.all((x.double() - got).abs()[inside] <= best[inside])
    assert torch.all(got[~inside].abs() == fmt.max)


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_fast_encoder_equals_brute_force_on_dense_adversarial_values(fmt):
    mags = fmt.magnitudes[: fmt.max_code + 1]
    mids = (mags[1:] + mags[:-1]) / 2
    g = torch.Generator().manual_seed(0)
    lo = max(fmt.min_positive / 4, 1e-300)
    log_uniform = torch.exp(torch.empty(20000, dtype=torch.float64).uniform_(math.log(lo), math.log(fmt.max * 4), generator=g))[:5000]
    x = torch.cat([mags, mids, torch.nextafter(mids, mids + 1), torch.nextafter(mids, mids - 1), log_uniform,
                   torch.tensor([0.0, fmt.max * 2, 1e300])])
    for dtype in (torch.float64, torch.float32):
        xs = x.to(dtype)
        xs = torch.cat([xs, -xs]) if fmt.signed else xs
        assert torch.equal(fmt.encode(xs), fmt.encode_reference(xs)), dtype
