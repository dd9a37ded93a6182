"""Minifloat number formats of at most 8 bits: exact encode (value -> integer code) and decode (code -> value).

One `FloatFormat(ebits, mbits, bias, signed, specials)` covers every element and scale format of microscaling:

  normal     (-1)^s * 2^(E - bias) * (1 + M / 2^m)        for E >= 1
  subnormal  (-1)^s * 2^(1 - bias) * (M / 2^m)            for E == 0 (only when the format has subnormals)

`specials` says which codes are not finite numbers, and so fixes the largest finite value:
  "none"      every code is a number (FP4 E2M1);
  "all_ones"  only the all-ones magnitude is NaN (OCP E4M3 "FN", E8M0's 0xFF);
  "ieee"      the all-ones exponent is reserved: M = 0 is infinity, M != 0 is NaN (E5M2).

Encoding rounds to nearest with ties to the even code (the even mantissa; for mbits = 0 formats such as E8M0 a tie
goes to the larger power of two, which is what torch's float8_e8m0fnu cast does). Finite values beyond the largest
finite value saturate to it (``saturate=True``, the default) or, like an IEEE cast, become Inf/NaN.

Two encoders live here: `encode` (fast: comparisons against the midpoints for FP4, exponent/significand
arithmetic for 8-bit formats) and `encode_reference` (brute-force nearest value). Tests check they agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import torch

from rankwise.errors import InvalidInputError, NumericalError, UnknownNameError

SPECIALS = ("none", "all_ones", "ieee")


@dataclass(frozen=True)
class FloatFormat:
    """A sign/exponent/mantissa format of at most 8 bits. Codes are unsigned integers 0 .. 2^bits - 1.

    `subnormals=False` means E == 0 is an ordinary exponent (E8M0, whose smallest value is 2^-bias) and the
    format has no zero.
    """

    name: str
    ebits: int
    mbits: int
    bias: int
    signed: bool = True
    specials: str = "none"
    subnormals: bool = True
    _cache: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        if self.specials not in SPECIALS:
            raise InvalidInputError(f"format {self.name}: specials must be one of {SPECIALS}, got {self.specials!r}")
        if self.ebits < 1 or self.mbits < 0 or self.bits > 8:
            raise InvalidInputError(f"format {self.name}: need ebits >= 1, mbits >= 0 and at most 8 bits in all")

    # ---- layout -------------------------------------------------------------------------------------------------
    @property
    def bits(self) -> int:
        return int(self.signed) + self.ebits + self.mbits

    @property
    def num_codes(self) -> int:
        return 1 << self.bits

    @property
    def sign_bit(self) -> int:
        """The code bit that holds the sign (0 for unsigned formats)."""
        return (1 << (self.ebits + self.mbits)) if self.signed else 0

    @cached_property
    def magnitudes(self) -> torch.Tensor:
        """Value of every magnitude code 0 .. 2^(ebits+mbits) - 1, float64 (NaN / Inf where the code is special)."""
        n = 1 << (self.ebits + self.mbits)
        out = torch.empty(n, dtype=torch.float64)
        top_e = (1 << self.ebits) - 1
        for code in range(n):
            e, m = code >> self.mbits, code & ((1 << self.mbits) - 1)
            if self.specials == "ieee" and e == top_e:
                out[code] = math.inf if m == 0 else math.nan
            elif self.specials == "all_ones" and code == n - 1:
                out[code] = math.nan
            elif e == 0 and self.subnormals:
                out[code] = math.ldexp(m, 1 - self.bias - self.mbits)
            else:
                out[code] = math.ldexp((1 << self.mbits) + m, e - self.bias - self.mbits)
        return out

    @cached_property
    def max_code(self) -> int:
        """Magnitude code of the largest finite value."""
        finite = torch.isfinite(self.magnitudes).nonzero()
        return int(finite.max())

    @property
    def max(self) -> float:
        return float(self.magnitudes[self.max_code])

    @property
    def min_normal(self) -> float:
        return math.ldexp(1.0, (1 if self.subnormals else 0) - self.bias)

    @property
    def min_positive(self) -> float:
        """Smallest positive value (the smallest subnormal where the format has subnormals)."""
        return float(self.magnitudes[1]) if self.subnormals else float(self.magnitudes[0])

    @property
    def emax(self) -> int:
        """Exponent of the largest power of two that is <= max (2 for E2M1: 4 <= 6; the MX scale rule uses it)."""
        return math.floor(math.log2(self.max))

    @property
    def nan_code(self) -> int | None:
        nan = torch.isnan(self.magnitudes).nonzero()
        return int(nan.max()) if len(nan) else None

    @property
    def inf_code(self) -> int | None:
        inf = torch.isinf(self.magnitudes).nonzero()
        return int(inf[0]) if len(inf) else None

    def describe(self) -> str:
        kind = "signed" if self.signed else "unsigned"
        return (f"{self.name}: {kind} {self.ebits} exponent / {self.mbits} mantissa bits, bias {self.bias}, "
                f"specials {self.specials}, max {self.max:g}, min normal 2^{round(math.log2(self.min_normal))}, "
                f"min positive 2^{round(math.log2(self.min_positive))}")

    # ---- decode -------------------------------------------------------------------------------------------------
    @cached_property
    def values(self) -> torch.Tensor:
        """Value of every code 0 .. 2^bits - 1 (float64), negative codes after the positive ones for signed formats."""
        return torch.cat([self.magnitudes, -self.magnitudes]) if self.signed else self.magnitudes.clone()

    def decode(self, codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Integer codes (any integer dtype, any shape) -> values of `dtype`, same shape."""
        if codes.dtype.is_floating_point or codes.dtype == torch.bool:
            raise InvalidInputError(f"{self.name}.decode wants integer codes, got {codes.dtype}")
        needs_check = not (codes.dtype == torch.uint8 and self.num_codes == 256)  # every uint8 is then a code
        if needs_check and codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.num_codes):
            raise InvalidInputError(f"{self.name} codes must lie in 0..{self.num_codes - 1}; got {int(codes.min())}..{int(codes.max())}")
        # A table lookup; F.embedding is the same gather without advanced indexing's per-call threading overhead.
        return torch.nn.functional.embedding(codes.long(), self._table(dtype).unsqueeze(1)).squeeze(-1)

    def _table(self, dtype: torch.dtype) -> torch.Tensor:
        key = ("table", dtype)
        if key not in self._cache:
            self._cache[key] = self.values.to(dtype)
        return self._cache[key]

    # ---- encode -------------------------------------------------------------------------------------------------
    def encode(self, x: torch.Tensor, saturate: bool = True) -> torch.Tensor:
        """Values (float32 or float64, any shape) -> uint8 codes, round to nearest, ties to even.

        Finite values beyond `max` saturate to +-max, or with ``saturate=False`` become the Inf code (if the format
        has one), else the NaN code (if it has one), else raise. +-Inf saturates likewise. NaN becomes the NaN code;
        a format without one raises `NumericalError`. Negative values in an unsigned format raise (-0 encodes as 0).
        The sign of a value that rounds to zero is kept (-0.1 -> -0 in FP4), as hardware and torchao do.
        """
        x = self._check_input(x)
        a = x.abs()
        mag = self._round_by_comparisons(a) if self.max_code <= 15 else self._round_by_arithmetic(a)
        return self._finish(x, self._handle_overflow(mag, a, saturate))

    def encode_reference(self, x: torch.Tensor, saturate: bool = True) -> torch.Tensor:
        """Same contract as `encode`, by brute force: the nearest entry of the value table (ties: even code; for
        mbits = 0, the larger value). Slow and memory-hungry, obviously right; tests check `encode` against it."""
        x = self._check_input(x).double()
        a = x.abs().reshape(-1)
        mags = self.magnitudes[: self.max_code + 1]
        codes = torch.arange(len(mags))
        preference = codes.double() if self.mbits == 0 else (codes % 2 == 0).double()  # the tie-break
        out = []
        for chunk in a.split(4096):
            dist = (chunk.unsqueeze(1) - mags.unsqueeze(0)).abs()
            best = dist == dist.min(dim=1, keepdim=True).values
            out.append(torch.argmax(best.double() * (1 + preference / (len(mags) + 1)), dim=1))
        mag = torch.cat(out).reshape(x.shape) if out else torch.zeros(x.shape, dtype=torch.long)
        # past max the nearest value is max (and float64 distances to huge values would all look equal)
        mag = torch.where(x.abs() > self.max, torch.full_like(mag, self.max_code), mag)
        return self._finish(x, self._handle_overflow(mag, x.abs(), saturate))

    def round(self, x: torch.Tensor, saturate: bool = True) -> torch.Tensor:
        """Round values onto the format's grid (encode then decode), same dtype as `x`."""
        return self.decode(self.encode(x, saturate), dtype=x.dtype)

    def _check_input(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
            raise InvalidInputError(f"{self.name}.encode wants a floating-point tensor, got {getattr(x, 'dtype', type(x))}")
        return x if x.dtype in (torch.float32, torch.float64) else x.float()

    def _round_by_comparisons(self, a: torch.Tensor) -> torch.Tensor:
        """Few codes (FP4): one comparison per midpoint between neighbouring values, counted into a uint8. Midpoint i
        separates codes i and i + 1; a tie goes up when i + 1 is the even code (always, for mbits = 0). Values past
        the last midpoint, Inf included, land on max_code. Midpoints have one bit more than the format, so they are
        exact in float32 (checked in tests)."""
        mags = self.magnitudes[: self.max_code + 1]
        mids = ((mags[1:] + mags[:-1]) / 2).tolist()
        mag = torch.zeros(a.shape, dtype=torch.uint8)
        for i, mid in enumerate(mids):
            mag += (a >= mid) if (i % 2 == 1 or self.mbits == 0) else (a > mid)
        return mag

    def _round_by_arithmetic(self, a: torch.Tensor) -> torch.Tensor:
        """Many codes (8-bit formats): exponent from frexp (exact), significand rounded half-to-even in float64,
        carry into the exponent, subnormals below the smallest normal exponent; beyond max (and Inf) -> max_code."""
        a = a.double()
        _, e2 = torch.frexp(a)  # a = f * 2^e2 with f in [0.5, 1), so floor(log2 a) = e2 - 1 exactly
        emin = (1 if self.subnormals else 0) - self.bias
        e = torch.where(a > 0, torch.clamp(e2.long() - 1, min=emin), emin)  # zero: smallest exponent
        scaled = torch.ldexp(a, (self.mbits - e).double())  # significand with its hidden bit, before rounding (exact)
        q = torch.round(scaled)  # half to even
        if self.mbits == 0:  # exponent-only formats: ties go up (see module docstring)
            q = torch.where(scaled - torch.floor(scaled) == 0.5, torch.floor(scaled) + 1, q)
        carry = q >= (1 << (self.mbits + 1))
        e = torch.where(carry, e + 1, e)
        q = torch.where(carry, q / 2, q)
        if not self.subnormals:  # no zero: everything below the smallest value rounds up to it
            q = torch.clamp(q, min=1 << self.mbits)
        normal = q >= (1 << self.mbits)
        mant = torch.where(normal, q - (1 << self.mbits), q).nan_to_num(0).long()
        mag = (torch.where(normal, e + self.bias, torch.zeros_like(e)) << self.mbits) | mant
        over = (torch.ldexp(q, (e - self.mbits).double()) > self.max) | torch.isinf(a)
        return torch.where(over, torch.full_like(mag, self.max_code), mag)

    def _handle_overflow(self, mag: torch.Tensor, a: torch.Tensor, saturate: bool) -> torch.Tensor:
        """Saturation is already done (beyond max -> max_code); a non-saturating, IEEE-style cast instead turns a
        value that rounds past max (or Inf) into the Inf code, else the NaN code, else refuses."""
        if saturate:
            return mag
        step = float(self.magnitudes[self.max_code]) - float(self.magnitudes[self.max_code - 1])
        overflow_at = self.max + step / 2  # midpoint between max and the next, unrepresentable, value
        max_is_odd = self.mbits == 0 or self.max_code % 2 == 1  # a tie leaves an odd max for the (even) next value
        over = (a > overflow_at) | ((a == overflow_at) & max_is_odd)
        if not over.any():
            return mag
        special = self.inf_code if self.inf_code is not None else self.nan_code
        if special is None:
            raise InvalidInputError(f"{int(over.sum())} value(s) exceed {self.name}'s max {self.max:g} and the format has "
                                    f"no Inf/NaN code; encode with saturate=True")
        return torch.where(over, torch.full_like(mag, special), mag)

    def _finish(self, x: torch.Tensor, mag: torch.Tensor) -> torch.Tensor:
        """Magnitude codes -> codes: add the sign bit, reject negatives in unsigned formats, map NaN."""
        code = mag
        if self.signed:
            code = code | (torch.signbit(x).to(code.dtype) << (self.ebits + self.mbits))
        else:
            negative = x < 0
            if negative.any():
                raise InvalidInputError(f"{self.name} is unsigned but {int(negative.sum())} value(s) are negative "
                                        f"(e.g. {float(x[negative].flatten()[0]):g}); pass magnitudes")
        nan = torch.isnan(x)
        if nan.any():
            if self.nan_code is None:
                raise NumericalError(f"{self.name} has no NaN code, but {int(nan.sum())} input value(s) are NaN")
            code = torch.where(nan, torch.full_like(code, self.nan_code), code)
        return code.to(torch.uint8)


# Elements
E2M1 = FloatFormat("e2m1", ebits=2, mbits=1, bias=1, signed=True, specials="none")
E4M3 = FloatFormat("e4m3", ebits=4, mbits=3, bias=7, signed=True, specials="all_ones")
E5M2 = FloatFormat("e5m2", ebits=5, mbits=2, bias=15, signed=True, specials="ieee")
# Scales
E8M0 = FloatFormat("e8m0", ebits=8, mbits=0, bias=127, signed=False, specials="all_ones", subnormals=False)
UE4M3 = FloatFormat("ue4m3", ebits=4, mbits=3, bias=7, signed=False, specials="all_ones")
# UE5M3's special values are not confirmed by the paper; "all_ones" (only 0xFF is NaN, max 114688) is the card's
# recommended reading. The other two readings are available by name for saturation studies.
UE5M3 = FloatFormat("ue5m3", ebits=5, mbits=3, bias=15, signed=False, specials="all_ones")
UE5M3_IEEE = FloatFormat("ue5m3-ieee", ebits=5, mbits=3, bias=15, signed=False, specials="ieee")
UE5M3_NO_SPECIALS = FloatFormat("ue5m3-nospecials", ebits=5, mbits=3, bias=15, signed=False, specials="none")

FORMATS: dict[str, FloatFormat] = {f.name: f for f in (E2M1, E4M3, E5M2, E8M0, UE4M3, UE5M3, UE5M3_IEEE, UE5M3_NO_SPECIALS)}
ALIASES = {"fp4": "e2m1", "fp8": "e4m3", "fp8-e4m3": "e4m3", "fp8-e5m2": "e5m2", "ue8m0": "e8m0"}


def get_format(name: str | FloatFormat) -> FloatFormat:
    """A format by name (e2m1/fp4, e4m3/fp8, e5m2, e8m0, ue4m3, ue5m3, ue5m3-ieee, ue5m3-nospecials)."""
    if isinstance(name, FloatFormat):
        return name
    key = ALIASES.get(name.lower(), name.lower())
    if key not in FORMATS:
        raise UnknownNameError(f"unknown number format {name!r}; known: {sorted(FORMATS) + sorted(ALIASES)}")
    return FORMATS[key]
