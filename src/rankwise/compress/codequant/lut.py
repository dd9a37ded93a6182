"""CodeQuant's lookup-table (LUT) matmul on the CPU: 4-bit weight codes into per-(row, group) centroids, times
per-token quantized activations.

A clustered linear `[out, in]` stores codes `a [out, in]` in [0, 16) (packed two per byte, the low nibble the even
column) and centroids `C [out, in / G, 16]`; the layer computes

    y[b, i] = sum_j C[i, j // G, a[i, j]] * x_hat[b, j],     x_hat = Q_a(x)  (act_quant.token_codes, per token)

`lut_matmul` runs the compiled kernel (lut_kernel.cpp, built once with torch.utils.cpp_extension into
TORCH_EXTENSIONS_DIR); `lut_matmul_reference` is the pure-torch definition (float64 matmul). Both are inference
only: the result carries no gradient. Which kernel path runs: `impl` ("auto", "avx512", "avx2", "scalar"), else the
environment variable RANKWISE_LUT_IMPL, else "auto" (the widest the CPU has). Where no compiler is available,
`lut_matmul` falls back to the reference with a warning, and `kernel_status()` says so.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

from rankwise.compress.codequant.act_quant import check_bits, token_codes
from rankwise.core.packing import pack_nibbles, unpack_nibbles
from rankwise.errors import InvalidInputError, MissingPackageError, NumericalError

KERNEL_NAME = "rankwise_codequant_lut"
KERNEL_SOURCE = Path(__file__).with_name("lut_kernel.cpp")
IMPL_ENV = "RANKWISE_LUT_IMPL"
IMPLS = {"auto": 0, "scalar": 1, "avx2": 2, "avx512": 3}  # the kernel's `impl` numbers
CENTROIDS = 16  # 4-bit weight codes
NONFINITE_MARKER = "rankwise_lut_nonfinite"  # the kernel's error for NaN / inf activations


# ----------------------------------------------------------------------------------------------------------------
# Packing


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """Codes uint8 `[out, in]` in [0, 16) -> packed uint8 `[out, in / 2]`, column 2t in the low nibble of byte t."""
    if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8 or codes.dim() != 2:
        raise InvalidInputError(f"codes must be a 2-D uint8 tensor [out, in], got {_describe(codes)}")
    if codes.size(1) % 2:
        raise InvalidInputError(f"codes have {codes.size(1)} columns: two codes share a byte, so `in` must be even")
    return pack_nibbles(codes).contiguous()  # the project's one nibble layout (also microscaling FP4's)


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """Packed uint8 `[out, in / 2]` -> codes uint8 `[out, in]` in [0, 16) (the inverse of `pack_codes`)."""
    _check_packed(packed)
    return unpack_nibbles(packed)


def dequantize_weight(packed: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """The clustered weight W_c `[out, in]` (centroids' dtype): W_c[i, j] = centroids[i, j // G, code[i, j]]."""
    _check_packed(packed)
    in_features, group = _check_centroids(packed, centroids)
    codes = unpack_codes(packed).view(packed.size(0), in_features // group, group).long()
    return centroids.gather(-1, codes).reshape(packed.size(0), in_features)


# ----------------------------------------------------------------------------------------------------------------
# The matmuls


def lut_matmul_reference(x: torch.Tensor, packed: torch.Tensor, centroids: torch.Tensor,
                         act_bits: int = 4) -> torch.Tensor:
    """Pure-torch definition: Q_a(x) `[..., in]` (float64 from the fp32 codes, scale, min) @ W_c^T in float64,
    returned as fp32 `[..., out]`. `packed` uint8 `[out, in / 2]`, `centroids` fp32 `[out, in / G, 16]`."""
    flat, lead = _check_inputs(x, packed, centroids)
    codes, scale, lo = token_codes(flat.detach(), bits=act_bits)  # [B, 1, in], [B, 1, 1], [B, 1, 1]
    x_hat = (codes.double() * scale.double() + lo.double()).squeeze(1)
    w = dequantize_weight(packed, centroids.detach().double())
    return (x_hat @ w.T).float().reshape(*lead, packed.size(0))


def lut_matmul(x: torch.Tensor, packed: torch.Tensor, centroids: torch.Tensor, act_bits: int = 4, *,
               impl: str | None = None) -> torch.Tensor:
    """Q_a(x) @ W_c^T through the compiled LUT kernel: x fp32 `[..., in]`, packed uint8 `[out, in / 2]`, centroids
    fp32 `[out, in / G, 16]` -> fp32 `[..., out]`, equal to `lut_matmul_reference` to fp32 rounding.

    The kernel quantizes the activations per token with `token_codes`' fp32 operations (NaN / inf: NumericalError,
    before any work), looks the weights up in registers and accumulates in fp32. `impl` forces a kernel path (see
    the module docstring).
    """
    flat, lead = _check_inputs(x, packed, centroids)
    name = _impl_name(impl)
    if not kernel_available():
        if name != "auto":
            load_kernel()  # raises MissingPackageError with the reason: a forced path cannot fall back
        _warn_fallback()
        return lut_matmul_reference(x, packed, centroids, act_bits)
    ops = load_kernel()
    if not _supports(name):
        raise InvalidInputError(f"this CPU cannot run the {name!r} LUT kernel path; use 'auto' or 'scalar'")
    check_bits(act_bits)
    try:  # the kernel quantizes the tokens itself (token_codes' operations, in fp32): ~60 us less per call
        y = ops.lut_matmul(flat.detach(), packed, centroids.detach(), act_bits, IMPLS[name])
    except RuntimeError as exc:
        if NONFINITE_MARKER in str(exc):
            raise NumericalError("activations contain NaN or infinity: nothing to quantize") from None
        raise
    return y.reshape(*lead, packed.size(0))


def kernel_quantize(x: torch.Tensor, act_bits: int = 4) -> torch.Tensor:
    """The kernel's own Q_a(x) for fp32 `[B, in]` (fp32 `[B, in]`), to check it against `token_codes`; needs the
    compiled kernel."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.dim() != 2 or x.size(1) == 0:
        raise InvalidInputError(f"x must be an fp32 tensor [B, in > 0], got {_describe(x)}")
    check_bits(act_bits)
    try:
        return load_kernel().quantize(x.detach(), act_bits)
    except RuntimeError as exc:
        if NONFINITE_MARKER in str(exc):
            raise NumericalError("activations contain NaN or infinity: nothing to quantize") from None
        raise


# ----------------------------------------------------------------------------------------------------------------
# The compiled kernel


def load_kernel() -> Any:
    """Compile lut_kernel.cpp once (cached in TORCH_EXTENSIONS_DIR, rebuilt when the source changes) and return its
    ops namespace, `torch.ops.rankwise_codequant_lut`. Raises MissingPackageError if it cannot be built."""
    ops, error = _build()
    if ops is None:
        raise MissingPackageError(f"the CodeQuant LUT kernel could not be built ({error}); install a C++ compiler "
                                  "and ninja (apt-get install g++; pip install ninja), or use lut_matmul_reference")
    return ops


def kernel_available() -> bool:
    """Whether the compiled kernel loads (compiling it on the first call)."""
    return _build()[0] is not None


def kernel_status() -> str:
    """One line for logs and benchmarks: which path `lut_matmul` takes on this machine, or why it falls back."""
    ops, error = _build()
    if ops is None:
        return f"LUT kernel unavailable ({error}): lut_matmul runs the pure-torch reference"
    chosen = {v: k for k, v in IMPLS.items()}[int(ops.resolved_impl(0))]
    forced = os.environ.get(IMPL_ENV)
    return f"compiled LUT kernel {KERNEL_NAME}: auto path {chosen}" + (f", {IMPL_ENV}={forced}" if forced else "")


@functools.cache
def _build() -> tuple[Any, str | None]:
    """(ops namespace, None) or (None, the reason it could not be built); tried once per process."""
    try:
        from torch.utils import cpp_extension

        # ninja ships in the virtual environment's bin/, which is not on PATH when its python runs unactivated.
        bin_dir = str(Path(sys.executable).parent)
        if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # compiler-version chatter, not the caller's concern
            cpp_extension.load(name=KERNEL_NAME, sources=[str(KERNEL_SOURCE)], extra_cflags=["-O3", "-ffp-contract=off"],
                               is_python_module=False, verbose=False)
        return getattr(torch.ops, KERNEL_NAME), None
    except Exception as exc:  # any build failure (no compiler, no ninja, headers): the reference still works
        return None, f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"


@functools.cache
def _supports(name: str) -> bool:
    """Whether this CPU can run the kernel path `name` (asked once per path: a call costs ~2 us)."""
    return bool(load_kernel().supports(IMPLS[name]))


@functools.cache
def _warn_fallback() -> None:
    warnings.warn(kernel_status(), RuntimeWarning, stacklevel=3)


# ----------------------------------------------------------------------------------------------------------------
# Validation (before any work)


def _describe(t: Any) -> str:
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"{t.dtype} tensor of shape {list(t.shape)} on {t.device}"


def _check_packed(packed: torch.Tensor) -> None:
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8 or packed.dim() != 2:
        raise InvalidInputError(f"packed codes must be a 2-D uint8 tensor [out, in / 2], got {_describe(packed)}")


def _check_centroids(packed: torch.Tensor, centroids: torch.Tensor) -> tuple[int, int]:
    """(in, G) after checking centroids `[out, in / G, 16]` against packed `[out, in / 2]`."""
    if not isinstance(centroids, torch.Tensor) or not centroids.is_floating_point() or centroids.dim() != 3:
        raise InvalidInputError(f"centroids must be a 3-D float tensor [out, in / G, 16], got {_describe(centroids)}")
    out, in_features = packed.size(0), 2 * packed.size(1)
    if centroids.size(0) != out or centroids.size(2) != CENTROIDS:
        raise InvalidInputError(f"centroids {list(centroids.shape)} do not match packed codes {list(packed.shape)}: "
                                f"expected [{out}, in / G, {CENTROIDS}]")
    groups = centroids.size(1)
    if in_features == 0 or groups == 0 or in_features % groups:
        raise InvalidInputError(f"{groups} centroid groups per row do not divide in = {in_features}: the group size "
                                "G must be a positive divisor of the input width")
    return in_features, in_features // groups


def _check_inputs(x: torch.Tensor, packed: torch.Tensor,
                  centroids: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """(x as fp32 [B, in], its leading dims) after checking every argument's dtype, device and shape."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.dim() < 1:
        raise InvalidInputError(f"x must be an fp32 tensor [..., in], got {_describe(x)}")
    _check_packed(packed)
    if not isinstance(centroids, torch.Tensor) or centroids.dtype != torch.float32:
        raise InvalidInputError(f"centroids must be an fp32 tensor [out, in / G, 16], got {_describe(centroids)}")
    for name, t in (("x", x), ("packed", packed), ("centroids", centroids)):
        if t.device.type != "cpu":
            raise InvalidInputError(f"the LUT matmul runs on the CPU; {name} is on {t.device}")
    if x.size(-1) % 2:
        raise InvalidInputError(f"x has {x.size(-1)} input columns: codes are packed two per byte, so `in` must be even")
    if x.size(-1) != 2 * packed.size(1):
        raise InvalidInputError(f"x has {x.size(-1)} input columns but the packed codes {list(packed.shape)} hold "
                                f"{2 * packed.size(1)}")
    _check_centroids(packed, centroids)
    return x.reshape(-1, x.size(-1)), tuple(x.shape[:-1])


def _impl_name(impl: str | None) -> str:
    name = impl if impl is not None else os.environ.get(IMPL_ENV, "auto")
    if name not in IMPLS:
        source = "impl" if impl is not None else IMPL_ENV
        raise InvalidInputError(f"{source} = {name!r} is not a LUT kernel path; choose one of {sorted(IMPLS)}")
    return name
