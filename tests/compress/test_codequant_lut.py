"""CodeQuant's LUT matmul: packing, the pure-torch reference, and the compiled kernel (every path) against it.

Tolerance of kernel vs reference, derived from the kernel's fp32 arithmetic (u = 2^-24): the kernel's activation is
x~ = fl(fl(q s) + m), off the exact x^ = q s + m by at most u (q s + |x^|) (1 + u); its dot product of n terms (any
order, with or without FMA) is off by at most gamma_n sum |w| |x~|, gamma_n = n u / (1 - n u); the reference is
rounded once to fp32 (u |y|). For n <= 4096 all of it is below
    tol = u * ((1.01 n + 2) * sum_j |w_j| (|x^_j| + q_j s) + |y|),
computed per output in float64 from the data. A wrong code (nibble order, group index) moves an output by about
s * |C|, far above tol at these sizes, which `test_tolerance_detects_a_wrong_code` checks.
"""

from __future__ import annotations

import pytest
import torch

from rankwise.compress.codequant import lut
from rankwise.compress.codequant.act_quant import token_codes
from rankwise.core.threads import limit_threads
from rankwise.errors import InvalidInputError, MissingPackageError, NumericalError

pytestmark = pytest.mark.method("codequant")

U = 2.0**-24
IMPLS = ["auto", "scalar", "avx2", "avx512"]
# (out, in, G): in not a multiple of 8/16/32, G = in, G = 32/64/128, an odd G (the scalar path), groups mixing the
# AVX-512 path's 128- and 32-column blocks and a tail
SHAPES = [(5, 30, 30), (7, 30, 15), (9, 100, 100), (6, 100, 50), (11, 200, 40), (13, 256, 32), (4, 384, 64),
          (3, 384, 128), (4, 400, 200), (3, 1024, 256), (10, 1000, 1000), (2, 2, 2)]


def problem(out, inn, group, batch, seed=0):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (out, inn), generator=g, dtype=torch.uint8)
    centroids = torch.randn(out, inn // group, 16, generator=g)
    x = torch.randn(batch, inn, generator=g) * 3 + 0.5
    return x, lut.pack_codes(codes), centroids


def tolerance(x, packed, centroids, y_ref, bits=4):
    """The bound in the module docstring, per output [B, out], in float64."""
    codes, scale, lo = token_codes(x, bits=bits)
    q_s = (codes.double() * scale.double()).squeeze(1)  # [B, in]
    x_hat = q_s + lo.double().squeeze(1)
    w = lut.dequantize_weight(packed, centroids.double()).abs()  # [out, in]
    n = x.size(-1)
    return U * ((1.01 * n + 2) * ((x_hat.abs() + q_s) @ w.T) + y_ref.double().abs())


@pytest.fixture(scope="module")
def kernel():
    if not lut.kernel_available():
        pytest.skip(lut.kernel_status())
    return lut.load_kernel()


def runnable(kernel, impl):
    if not kernel.supports(lut.IMPLS[impl]):
        pytest.skip(f"this CPU cannot run the {impl} path")


# ---------------------------------------------------------------------------------------------------------------- packing


@pytest.mark.parametrize("shape", [(1, 2), (3, 30), (17, 100), (0, 4)])
def test_pack_unpack_round_trip(shape):
    codes = torch.randint(0, 16, shape, generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    packed = lut.pack_codes(codes)
    assert packed.shape == (shape[0], shape[1] // 2) and packed.dtype == torch.uint8
    assert torch.equal(lut.unpack_codes(packed), codes)


def test_low_nibble_is_the_even_column():
    assert lut.pack_codes(torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8)).tolist() == [[0x21, 0x0F]]


@pytest.mark.parametrize("codes, match", [
    (torch.zeros(2, 3, dtype=torch.uint8), "even"),
    (torch.tensor([[0, 16]], dtype=torch.uint8), "4-bit"),
    (torch.zeros(2, 4, dtype=torch.int64), "uint8"),
    (torch.zeros(4, dtype=torch.uint8), "2-D"),
])
def test_pack_refuses_bad_codes(codes, match):
    with pytest.raises(InvalidInputError, match=match):
        lut.pack_codes(codes)


def test_dequantize_weight_uses_the_group_of_each_column():
    x, packed, centroids = problem(3, 12, 4, 1)
    codes = lut.unpack_codes(packed)
    w = lut.dequantize_weight(packed, centroids)
    expected = [[centroids[i, j // 4, int(codes[i, j])].item() for j in range(12)] for i in range(3)]
    assert w.tolist() == expected


# ---------------------------------------------------------------------------------------------------------------- reference


def integer_problem(out=6, inn=40, group=20, batch=3):
    """Small integers everywhere, so every path is exact: each x row holds 0 and 15, hence scale 1 and min 0, and
    x^ = x; sums stay far below 2^24."""
    g = torch.Generator().manual_seed(2)
    x = torch.randint(0, 16, (batch, inn), generator=g).float()
    x[:, 0], x[:, 1] = 0.0, 15.0
    codes = torch.randint(0, 16, (out, inn), generator=g, dtype=torch.uint8)
    centroids = torch.randint(-8, 9, (out, inn // group, 16), generator=g).float()
    packed = lut.pack_codes(codes)
    return x, packed, centroids, x.double() @ lut.dequantize_weight(packed, centroids).double().T


def test_reference_is_exact_on_integers():
    x, packed, centroids, exact = integer_problem()
    assert torch.equal(lut.lut_matmul_reference(x, packed, centroids).double(), exact)


def test_reference_quantizes_the_activations():
    x, packed, centroids = problem(4, 64, 64, 2)
    x_hat = torch.stack([torch.tensor(_exact_q(row), dtype=torch.float64) for row in x])
    y = lut.lut_matmul_reference(x, packed, centroids)
    expected = (x_hat @ lut.dequantize_weight(packed, centroids).double().T).float()
    assert torch.equal(y, expected)


def _exact_q(row):
    codes, scale, lo = token_codes(row[None])
    return (codes.double() * scale.double() + lo.double()).flatten().tolist()


def test_reference_keeps_leading_dims():
    x, packed, centroids = problem(5, 30, 15, 6)
    y = lut.lut_matmul_reference(x.view(2, 3, 30), packed, centroids)
    assert y.shape == (2, 3, 5)
    assert torch.equal(y.view(6, 5), lut.lut_matmul_reference(x, packed, centroids))


# ---------------------------------------------------------------------------------------------------------------- kernel


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("batch", [1, 3, 17])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_kernel_equals_reference(kernel, impl, batch, shape):
    runnable(kernel, impl)
    x, packed, centroids = problem(*shape, batch, seed=sum(shape) + batch)
    ref = lut.lut_matmul_reference(x, packed, centroids)
    y = lut.lut_matmul(x, packed, centroids, impl=impl)
    assert y.shape == ref.shape and y.dtype == torch.float32
    err = (y.double() - ref.double()).abs()
    assert (err <= tolerance(x, packed, centroids, ref)).all(), f"max error {err.max():.3g}"


@pytest.mark.parametrize("impl", IMPLS)
def test_kernel_is_exact_on_integers(kernel, impl):
    runnable(kernel, impl)
    for group in (40, 20, 10):  # G = in; one 16-block + tail; tails only
        x, packed, centroids, exact = integer_problem(group=group)
        assert torch.equal(lut.lut_matmul(x, packed, centroids, impl=impl).double(), exact)


@pytest.mark.parametrize("impl", IMPLS)
def test_threads_split_rows_without_changing_them(kernel, impl):
    runnable(kernel, impl)
    x, packed, centroids = problem(37, 256, 128, 5)  # odd row count: a 2-row block straddles the split
    one = lut.lut_matmul(x, packed, centroids, impl=impl)
    with limit_threads(2):
        assert torch.equal(lut.lut_matmul(x, packed, centroids, impl=impl), one)  # rows are independent


def test_tolerance_detects_a_wrong_code(kernel):
    x, packed, centroids = problem(8, 256, 32, 3)
    ref = lut.lut_matmul_reference(x, packed, centroids)
    swapped = (packed >> 4) | (packed << 4)  # the nibble order a kernel could get wrong
    err = (lut.lut_matmul(x, swapped, centroids).double() - ref.double()).abs()
    assert (err > tolerance(x, packed, centroids, ref)).any()


@pytest.mark.parametrize("bits", [2, 4, 8, 16])
def test_kernel_quantizer_is_token_codes(kernel, bits):
    g = torch.Generator().manual_seed(bits)
    x = torch.randn(5, 77, generator=g) * 4
    x[1] = 0.25                                   # a constant token: scale clamped at MIN_SCALE
    x[2] = torch.arange(77) % 16 * 0.5            # exact halves: round half to even must agree
    x[3, :3] = torch.tensor([0.0, 15.0, 7.5])
    codes, scale, lo = token_codes(x, bits=bits)
    expected = codes.float().mul_(scale).add_(lo).squeeze(1)  # token_codes' levels in fp32, no FMA
    assert torch.equal(lut.kernel_quantize(x, bits), expected)


@pytest.mark.parametrize("impl", IMPLS)
def test_kernel_keeps_leading_dims(kernel, impl):
    runnable(kernel, impl)
    x, packed, centroids = problem(5, 64, 32, 6)
    y = lut.lut_matmul(x.view(3, 2, 64), packed, centroids, impl=impl)
    assert y.shape == (3, 2, 5)
    assert torch.equal(y.view(6, 5), lut.lut_matmul(x, packed, centroids, impl=impl))
    assert lut.lut_matmul(x[0], packed, centroids, impl=impl).shape == (5,)
    assert lut.lut_matmul(x[:0], packed, centroids, impl=impl).shape == (0, 5)


def test_environment_variable_picks_the_path(kernel, monkeypatch):
    x, packed, centroids = problem(7, 100, 50, 3)
    ref = lut.lut_matmul_reference(x, packed, centroids)
    monkeypatch.setenv(lut.IMPL_ENV, "scalar")
    assert "RANKWISE_LUT_IMPL=scalar" in lut.kernel_status()
    err = (lut.lut_matmul(x, packed, centroids).double() - ref.double()).abs()
    assert (err <= tolerance(x, packed, centroids, ref)).all()
    monkeypatch.setenv(lut.IMPL_ENV, "sse9")
    with pytest.raises(InvalidInputError, match="RANKWISE_LUT_IMPL"):
        lut.lut_matmul(x, packed, centroids)


def test_kernel_status_names_the_path(kernel):
    assert lut.kernel_status().startswith("compiled LUT kernel")


def test_falls_back_to_the_reference_without_a_compiler(monkeypatch):
    monkeypatch.setattr(lut, "_build", lambda: (None, "RuntimeError: no compiler"))
    lut._warn_fallback.cache_clear()
    x, packed, centroids = problem(4, 30, 15, 2)
    assert "unavailable" in lut.kernel_status() and not lut.kernel_available()
    with pytest.warns(RuntimeWarning, match="reference"):
        y = lut.lut_matmul(x, packed, centroids)
    assert torch.equal(y, lut.lut_matmul_reference(x, packed, centroids))
    with pytest.raises(MissingPackageError, match="no compiler"):
        lut.lut_matmul(x, packed, centroids, impl="scalar")  # a forced path cannot fall back
    lut._warn_fallback.cache_clear()


# ---------------------------------------------------------------------------------------------------------------- bad input

FUNCTIONS = [lut.lut_matmul_reference, lut.lut_matmul]


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_refuses_bad_shapes_and_dtypes(fn):
    x, packed, centroids = problem(4, 30, 15, 2)
    cases = [
        ((torch.zeros(2, 31), packed, centroids), "even"),
        ((torch.zeros(2, 32), packed, centroids), "hold 30"),
        ((x, packed, torch.zeros(4, 4, 16)), "divide"),
        ((x, packed, torch.zeros(4, 2, 8)), "do not match"),
        ((x, packed, torch.zeros(5, 2, 16)), "do not match"),
        ((x.double(), packed, centroids), "fp32"),
        ((x, packed.int(), centroids), "uint8"),
        ((x, packed, centroids.double()), "fp32"),
        ((x, packed[0], centroids), "2-D"),
        ((torch.zeros(()), packed, centroids), "fp32 tensor"),
    ]
    for args, match in cases:
        with pytest.raises(InvalidInputError, match=match):
            fn(*args)


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_refuses_non_finite_activations(fn, bad):
    x, packed, centroids = problem(4, 30, 15, 2)
    x[1, 7] = bad
    with pytest.raises(NumericalError, match="NaN or infinity"):
        fn(x, packed, centroids)


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_refuses_bad_bits(fn):
    x, packed, centroids = problem(4, 30, 15, 2)
    with pytest.raises(InvalidInputError, match="bits"):
        fn(x, packed, centroids, act_bits=1)


def test_refuses_an_unknown_path(kernel):
    x, packed, centroids = problem(4, 30, 15, 2)
    with pytest.raises(InvalidInputError, match="not a LUT kernel path"):
        lut.lut_matmul(x, packed, centroids, impl="neon")
