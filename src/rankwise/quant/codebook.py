"""Codebook (lookup-table) quantization of weights: blockwise absmax INT-b and QLoRA's NormalFloat NF-b, with
optional double quantization of the block scales.

Every run of `block_size` weights along the last dimension (the input dimension of an `[out, in]` weight) shares
one scale, its absmax `s`; each weight is stored as the index of the nearest level of a codebook `L` normalised to
[-1, 1]:

    q = argmin_k |x / s - L[k]|,    x_hat = s * L[q]

  int   symmetric integers: L = {-(2^(b-1)-1), ..., 2^(b-1)-1} / (2^(b-1)-1)  (2^b - 1 levels; per-channel INT8 is
        `block_size=None`, one block per row)
  nf    QLoRA's NormalFloat: 2^(b-1) positive and 2^(b-1)-1 negative quantiles of N(0, 1) plus an exact zero
        ("asymmetric zero"), normalised by the largest; 2^b levels, b in {2, 3, 4, 8}

Both codebooks hold +-1 and 0 exactly, so (with fp32 scales) the weight of largest magnitude in a block is reproduced
exactly, and quantizing a dequantized tensor again gives back the same codes, scales and values (idempotence, tested
bit for bit, for every storage option).

Double quantization (`scale_bits=b1`) stores the positive block scales themselves on an unsigned b1-bit linear grid,
one second-level scale (their absmax, kept in `scale_dtype`) per `scale_block_size` scales along the flattened scale
tensor. Scales round down onto their storage grid (so each block's largest weight lands on +-1); a nonzero scale
never rounds to zero (its code is at least 1), so no block is flushed. Storage, in bits per
weight (QLoRA's formula):

    b0 + b_scale / B0                           (no double quantization; b_scale = 32, 16 or 16 for fp32/fp16/bf16)
    b0 + b1 / B0 + b_scale / (B0 * B1)          (double quantization)

Reading chosen where QLoRA differs: QLoRA subtracts the mean of the scales and stores them in 8-bit floats; the mean
of the dequantized scales is not the mean of the originals, which would break idempotence, so the scales go on an
unsigned absmax grid here (scales are positive, so no centring is needed for an unsigned grid).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from rankwise.errors import InvalidInputError, NumericalError, UnknownNameError

KINDS = ("int", "nf")
INT_BITS = range(2, 9)
NF_BITS = (2, 3, 4, 8)
SCALE_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def int_levels(bits: int) -> torch.Tensor:
    """Symmetric integer codebook, float64 [2^bits - 1], ascending, from -1 to 1."""
    _check_bits("int", bits)
    qmax = 2 ** (bits - 1) - 1
    return torch.arange(-qmax, qmax + 1, dtype=torch.float64) / qmax


@lru_cache(maxsize=None)
def _nf_levels(bits: int) -> torch.Tensor:
    n = 2 ** bits
    # QLoRA's offset: the middle of 1 - 1/(2(n-1)) and 1 - 1/(2n), so the outermost quantile is finite (for n = 16
    # it is bitsandbytes' 0.9677083).
    offset = 0.5 * ((1 - 1 / (2 * (n - 1))) + (1 - 1 / (2 * n)))
    half = n // 2
    positive = torch.special.ndtri(torch.linspace(offset, 0.5, half + 1, dtype=torch.float64)[:-1])  # half values
    negative = -torch.special.ndtri(torch.linspace(offset, 0.5, half, dtype=torch.float64)[:-1])  # half - 1 values
    levels = torch.cat([negative, torch.zeros(1, dtype=torch.float64), positive]).sort().values
    return levels / levels.abs().max()


def nf_levels(bits: int) -> torch.Tensor:
    """QLoRA NormalFloat codebook, float64 [2^bits], ascending, from -1 to 1 with an exact 0."""
    _check_bits("nf", bits)
    return _nf_levels(bits).clone()


def codebook_levels(kind: str, bits: int) -> torch.Tensor:
    """The normalised codebook of `kind` ('int' or 'nf') at `bits` bits, float64, ascending, min -1, max 1."""
    if kind not in KINDS:
        raise UnknownNameError(f"unknown codebook kind {kind!r}; known: {list(KINDS)}")
    return int_levels(bits) if kind == "int" else nf_levels(bits)


def _check_bits(kind: str, bits: int) -> None:
    allowed = tuple(INT_BITS) if kind == "int" else NF_BITS
    if not isinstance(bits, int) or isinstance(bits, bool) or bits not in allowed:
        raise InvalidInputError(f"{kind} codebooks take bits in {list(allowed)}, got {bits!r}")


def storage_bits_per_weight(bits: int, block_size: int, scale_bits: int | None = None,
                            scale_block_size: int | None = None, scale_storage_bits: int = 32) -> float:
    """Bits per weight b0 + b1/B0 + b2/(B0*B1) (double quantization) or b0 + b2/B0 (fp scales), as in QLoRA."""
    for label, v in (("bits", bits), ("block_size", block_size), ("scale_storage_bits", scale_storage_bits)):
        if not isinstance(v, int) or v < 1:
            raise InvalidInputError(f"{label} must be a positive integer, got {v!r}")
    if scale_bits is None:
        return bits + scale_storage_bits / block_size
    if not scale_block_size or scale_block_size < 1:
        raise InvalidInputError(f"double quantization needs a positive scale_block_size, got {scale_block_size!r}")
    return bits + scale_bits / block_size + scale_storage_bits / (block_size * scale_block_size)


@dataclass(frozen=True)
class CodebookRecipe:
    """How to codebook-quantize a weight. block_size=None: one block per row (per-channel)."""

    kind: str = "nf"
    bits: int = 4
    block_size: int | None = 64
    scale_bits: int | None = None  # b1: double-quantize the block scales at this many bits (None: keep them)
    scale_block_size: int = 256  # B1: scales per second-level scale
    scale_dtype: str = "fp32"  # storage of the top-level scales (the block scales, or the second-level ones)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UnknownNameError(f"unknown codebook kind {self.kind!r}; known: {list(KINDS)}")
        _check_bits(self.kind, self.bits)
        if self.block_size is not None and (not isinstance(self.block_size, int) or self.block_size < 1):
            raise InvalidInputError(f"block_size must be a positive integer or None (per-channel), got {self.block_size!r}")
        if self.scale_bits is not None and (not isinstance(self.scale_bits, int) or not 2 <= self.scale_bits <= 16):
            raise InvalidInputError(f"scale_bits must be an integer in 2..16 or None, got {self.scale_bits!r}")
        if not isinstance(self.scale_block_size, int) or self.scale_block_size < 1:
            raise InvalidInputError(f"scale_block_size must be a positive integer, got {self.scale_block_size!r}")
        if self.scale_dtype not in SCALE_DTYPES:
            raise InvalidInputError(f"scale_dtype must be one of {list(SCALE_DTYPES)}, got {self.scale_dtype!r}")

    @property
    def name(self) -> str:
        block = "ch" if self.block_size is None else f"b{self.block_size}"
        dq = f"-dq{self.scale_bits}x{self.scale_block_size}" if self.scale_bits else ""
        return f"{self.kind}{self.bits}-{block}{dq}-{self.scale_dtype}"

    @property
    def levels(self) -> torch.Tensor:
        return codebook_levels(self.kind, self.bits)

    def bits_per_weight(self, in_features: int | None = None) -> float:
        """Storage bits per weight; per-channel recipes need `in_features` (the block length)."""
        block = self.block_size or in_features
        if block is None:
            raise InvalidInputError("a per-channel recipe's bits per weight depend on in_features; pass it")
        return storage_bits_per_weight(self.bits, block, self.scale_bits, self.scale_block_size,
                                       torch.finfo(SCALE_DTYPES[self.scale_dtype]).bits)


RECIPES: dict[str, CodebookRecipe] = {
    "int8": CodebookRecipe("int", 8, None),  # per-channel absmax
    "int4": CodebookRecipe("int", 4, 32),
    "int3": CodebookRecipe("int", 3, 32),
    "nf4": CodebookRecipe("nf", 4, 64),
    "nf4-dq": CodebookRecipe("nf", 4, 64, scale_bits=8, scale_block_size=256),
    "nf3": CodebookRecipe("nf", 3, 64),
    "nf2": CodebookRecipe("nf", 2, 64),
}


def get_codebook_recipe(name: str | CodebookRecipe) -> CodebookRecipe:
    """A named recipe from RECIPES (or the recipe itself)."""
    if isinstance(name, CodebookRecipe):
        return name
    if name not in RECIPES:
        raise UnknownNameError(f"unknown codebook recipe {name!r}; known: {sorted(RECIPES)}")
    return RECIPES[name]


@dataclass
class CodebookTensor:
    """A codebook-quantized tensor of original shape [..., K] (K padded to Kp, a multiple of the block size).

    codes: uint8 [..., Kp] level indices (bits <= 8); scales: float32 [..., Kp / B0] block
    scales as dequantized (already on their storage grid); scale_codes / second_scales: the double-quantized form
    ([n_scales] int32 codes and float32 [ceil(n_scales / B1)] second-level scales), None without it."""

    codes: torch.Tensor
    scales: torch.Tensor
    shape: tuple[int, ...]
    recipe: CodebookRecipe
    scale_codes: torch.Tensor | None = None
    second_scales: torch.Tensor | None = None

    def dequantize(self) -> torch.Tensor:
        """float32 tensor of the original shape: x_hat = s * L[q], computed in float64 and rounded once."""
        levels = _levels(self.recipe.kind, self.recipe.bits)
        q = levels[self.codes.long()]  # [..., Kp]
        block = q.size(-1) // self.scales.size(-1)
        x = q.reshape(*q.shape[:-1], -1, block) * self.scales.double().unsqueeze(-1)
        x = x.reshape(*x.shape[:-2], -1)[..., : self.shape[-1]]
        return x.to(torch.float32).reshape(self.shape)


def _levels(kind: str, bits: int) -> torch.Tensor:
    return _int_levels_cached(bits) if kind == "int" else _nf_levels(bits)


@lru_cache(maxsize=None)
def _int_levels_cached(bits: int) -> torch.Tensor:
    return int_levels(bits)


def nearest_level(y: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """Index of the nearest level (ascending float64 [n]) for each y (any shape); ties go to the lower level."""
    midpoints = (levels[1:] + levels[:-1]) / 2
    return torch.bucketize(y.double(), midpoints)


def _round_down_to(x: torch.Tensor, dtype_name: str) -> torch.Tensor:
    """Nonnegative float64 values rounded toward zero onto the storage dtype, returned as float64.

    Rounding scales down (never up) puts every block's largest weight at |x / s| >= 1, i.e. on the +-1 level; that
    is what makes quantizing a dequantized tensor reproduce the same scales. The clipping it costs is at most one
    storage rounding (2^-8 relative for bf16) on the largest weight of a block."""
    r = x.to(SCALE_DTYPES[dtype_name])
    r = torch.where(r.double() > x, torch.nextafter(r, torch.zeros_like(r)), r)
    return r.double()


def quantize_codebook(x: torch.Tensor, recipe: CodebookRecipe | str) -> CodebookTensor:
    """Codebook-quantize `x` [..., K] in blocks along its last dimension (zero-padded to a block multiple).

    Raises `InvalidInputError` for a non-float or empty tensor and `NumericalError` for NaN/Inf."""
    recipe = get_codebook_recipe(recipe)
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point or x.dim() == 0 or x.numel() == 0:
        raise InvalidInputError(f"quantize_codebook wants a non-empty floating-point tensor with at least one "
                                f"dimension, got {getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}")
    if not torch.isfinite(x).all():
        raise NumericalError("cannot quantize a tensor with NaN/Inf values: a block scale would be meaningless")
    shape = tuple(x.shape)
    k = recipe.block_size or shape[-1]
    x = x.detach().double()
    if shape[-1] % k:
        x = torch.nn.functional.pad(x, (0, k - shape[-1] % k))  # zeros do not change a block's absmax
    blocks = x.reshape(*x.shape[:-1], -1, k)  # [..., nb, k]
    scales = blocks.abs().amax(dim=-1)  # [..., nb] float64
    scale_codes = second = None
    if recipe.scale_bits is None:
        scales = _round_down_to(scales, recipe.scale_dtype)
    else:
        scales, scale_codes, second = _double_quantize(scales, recipe)
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    # |x / s| may exceed 1 by the downward rounding of s; the end levels +-1 absorb it (nearest level).
    levels = _levels(recipe.kind, recipe.bits)
    codes = nearest_level(blocks / safe.unsqueeze(-1), levels)  # [..., nb, k]
    if scale_codes is not None:
        # A block far below its scale group's maximum can round to all zeros; give it scale 0 (code 0), as a
        # second pass over the all-zero result would, so that re-quantization stays idempotent.
        dead = (levels[codes] == 0).all(dim=-1) & (scales > 0)
        scales = torch.where(dead, torch.zeros_like(scales), scales)
        scale_codes = torch.where(dead.reshape(-1), torch.zeros_like(scale_codes), scale_codes)
    codes = codes.to(torch.uint8).reshape(*x.shape)
    return CodebookTensor(codes, scales.float(), shape, recipe, scale_codes, second)


def _double_quantize(scales: torch.Tensor, recipe: CodebookRecipe) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Block scales float64 [..., nb] -> (dequantized scales [..., nb] float64, codes int32 [n], second-level
    scales float32 [ceil(n / B1)]) on the unsigned b1-bit grid k * c / (2^b1 - 1), k = 1 .. 2^b1 - 1 (0 for 0).

    Codes round down (with a 2^-20 relative allowance for the float32 rounding of a scale that already sits on
    the grid), for the reason given in `_round_down_to`."""
    flat = scales.reshape(-1)
    n, b1 = flat.numel(), recipe.scale_block_size
    padded = torch.nn.functional.pad(flat, (0, (-n) % b1)).reshape(-1, b1)
    top = 2 ** recipe.scale_bits - 1
    second = _round_down_to(padded.amax(dim=1), recipe.scale_dtype)  # [n2]
    safe = torch.where(second > 0, second, torch.ones_like(second))
    codes = torch.floor(padded / safe.unsqueeze(1) * top * (1 + 2.0 ** -20)).clamp(0, top)
    codes = torch.where((padded > 0) & (codes == 0), torch.ones_like(codes), codes)  # never flush a nonzero block
    values = (codes / top * second.unsqueeze(1)).reshape(-1)[:n]
    return values.reshape(scales.shape), codes.reshape(-1)[:n].to(torch.int32), second.float()


def fake_quantize_codebook(x: torch.Tensor, recipe: CodebookRecipe | str) -> torch.Tensor:
    """Quantize-dequantize: float32 [..., K] on the recipe's grid, same shape as `x`."""
    return quantize_codebook(x, recipe).dequantize()
