"""Block quantization along the last dimension: every run of `block_size` elements shares one scale.

A recipe names the element format, the scale format, the block size, whether a per-tensor fp32 "global" scale S
sits above the block scales, and how the block scale is rounded:

  power-of-two scales (E8M0, the MX rules; `emax` = exponent of the element's largest power of two, 2 for E2M1)
    floor  X = 2^(floor(log2 amax) - emax)            OCP MX v1.0; amax / X in [4, 8), so (6, 8) clips
    ceil   X = 2^(ceil(log2 amax) - emax)             never clips, wastes range
    even   floor after rounding amax to the element's mantissa width (torchao's EVEN)
    rceil  X = 2^ceil(log2(amax / max_elem))          NVIDIA's rule for MXFP8/MXFP4 (cvt.rp to UE8M0)
  minifloat scales (UE4M3, UE5M3; `rne`)
    s_b = RNE_scale((amax_b / max_elem) / S), saturating; S = amax_tensor / (max_elem * max_scale) or 1.

Elements: q = RNE_elem(x * ((1 / S) / s_b)), saturating at +-max_elem; x_hat = q * s_b * S. The scaling multiplies
by a reciprocal, as NVIDIA's kernels and torchao do, so codes match theirs bit for bit. A block whose scale rounds
to zero (UE4M3 underflow: amax / 6 < 2^-10) is flushed to zero; `clamp_scale_to_min_normal` instead lifts such
scales to the smallest normal scale, torchao's NVFP4 convention (it never produces zero or subnormal scales).

Shapes whose last dimension is not a multiple of the block size raise, unless ``pad=True``: then the last dimension
is padded with zeros (zeros do not change a block's amax) and `dequantize` crops the padding off again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from rankwise.core.threads import limit_threads
from rankwise.errors import InvalidInputError, NumericalError, UnknownNameError
from rankwise.quant.formats import E2M1, E4M3, E8M0, UE4M3, UE5M3, FloatFormat, get_format

# Block quantization is memory-bound elementwise work. On the shared, oversubscribed 2-core CPUs this project runs
# on, OpenMP's barrier after each of its ~30 small ops costs far more than a second core gains (measured: 20x
# slower with 2 threads under load, at most ~1.8x faster on an idle machine), so quantize/dequantize run on this
# many threads and restore torch's setting afterwards. None leaves torch's setting alone. Results do not depend on it.
QUANT_NUM_THREADS: int | None = 1

POWER_OF_TWO_RULES = ("floor", "ceil", "even", "rceil")
SCALE_RULES = ("rne", *POWER_OF_TWO_RULES)
MIN_BLOCK, MAX_BLOCK = 2, 1024
E8M0_EXP_MIN, E8M0_EXP_MAX = -127, 127


@dataclass(frozen=True)
class BlockRecipe:
    """How to block-quantize a tensor. `scale=None` keeps exact fp32 block scales (the "no scale error" baseline)."""

    name: str
    element: FloatFormat = E2M1
    scale: FloatFormat | None = UE4M3
    block_size: int = 16
    global_scale: bool = False
    scale_rule: str = "rne"
    clamp_scale_to_min_normal: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.block_size, int) or not MIN_BLOCK <= self.block_size <= MAX_BLOCK or self.block_size % 2:
            raise InvalidInputError(f"recipe {self.name}: block size must be an even integer in {MIN_BLOCK}..{MAX_BLOCK} "
                                    f"(two FP4 codes share a byte), got {self.block_size!r}")
        if self.scale_rule not in SCALE_RULES:
            raise InvalidInputError(f"recipe {self.name}: scale rule must be one of {SCALE_RULES}, got {self.scale_rule!r}")
        is_pow2 = self.scale is not None and self.scale.mbits == 0
        if is_pow2 != (self.scale_rule in POWER_OF_TWO_RULES):
            raise InvalidInputError(f"recipe {self.name}: rules {POWER_OF_TWO_RULES} go with E8M0 scales and 'rne' with "
                                    f"minifloat or exact scales; got scale {self.scale and self.scale.name} with {self.scale_rule!r}")
        if is_pow2 and self.scale is not E8M0:
            raise InvalidInputError(f"recipe {self.name}: the only power-of-two scale format is e8m0")
        if is_pow2 and self.global_scale:
            raise InvalidInputError(f"recipe {self.name}: E8M0 scales span 2^-127..2^127 and take no per-tensor scale")

    def with_block_size(self, block_size: int) -> BlockRecipe:
        return replace(self, block_size=block_size)

    def describe(self) -> str:
        scale = self.scale.name if self.scale else "fp32"
        extra = f", rule {self.scale_rule}" if self.scale_rule != "rne" else ""
        extra += ", per-tensor scale" if self.global_scale else ""
        extra += ", scales clamped to min normal" if self.clamp_scale_to_min_normal else ""
        return f"{self.name}: {self.element.name} elements, {scale} scales, block {self.block_size}{extra}"

    @property
    def bits_per_element(self) -> float:
        """Storage bits per element, the block scale amortised (the global scale is negligible)."""
        scale_bits = self.scale.bits if self.scale else 32
        return self.element.bits + scale_bits / self.block_size


RECIPES: dict[str, BlockRecipe] = {r.name: r for r in (
    BlockRecipe("mxfp4", E2M1, E8M0, 32, scale_rule="floor"),
    BlockRecipe("mxfp4-ceil", E2M1, E8M0, 32, scale_rule="ceil"),
    BlockRecipe("mxfp4-even", E2M1, E8M0, 32, scale_rule="even"),
    BlockRecipe("mxfp4-rceil", E2M1, E8M0, 32, scale_rule="rceil"),
    BlockRecipe("mxfp8", E4M3, E8M0, 32, scale_rule="floor"),
    BlockRecipe("nvfp4", E2M1, UE4M3, 16, global_scale=True, clamp_scale_to_min_normal=True),
    BlockRecipe("fp4-ue4m3", E2M1, UE4M3, 16),
    BlockRecipe("fp4-ue4m3-s", E2M1, UE4M3, 16, global_scale=True),
    BlockRecipe("fp4-ue5m3", E2M1, UE5M3, 16),
    BlockRecipe("fp4-ue5m3-s", E2M1, UE5M3, 16, global_scale=True),
    BlockRecipe("fp4-fp32", E2M1, None, 16),
)}


def get_recipe(name: str | BlockRecipe, block_size: int | None = None) -> BlockRecipe:
    """A named recipe (see RECIPES), optionally at another block size."""
    recipe = name if isinstance(name, BlockRecipe) else RECIPES.get(name)
    if recipe is None:
        raise UnknownNameError(f"unknown block-quantization recipe {name!r}; known: {sorted(RECIPES)}")
    return recipe if block_size is None else recipe.with_block_size(block_size)


def make_recipe(element: str = "fp4", scale: str = "ue5m3", block_size: int = 16, global_scale: bool = False,
                scale_rule: str | None = None) -> BlockRecipe:
    """A recipe from format names, as the CLI takes them. `scale` may be 'fp32' for exact scales."""
    scale_fmt = None if scale.lower() in ("fp32", "exact") else get_format(scale)
    rule = scale_rule or ("floor" if scale_fmt is E8M0 else "rne")
    elem = get_format(element)
    name = f"{elem.name}-{scale_fmt.name if scale_fmt else 'fp32'}{'-s' if global_scale else ''}-k{block_size}"
    return BlockRecipe(name, elem, scale_fmt, block_size, global_scale, rule)


@dataclass
class QuantizedTensor:
    """A block-quantized tensor. codes: uint8 [..., Kp] element codes (Kp = K padded to a block multiple);
    scales: [..., Kp / k] uint8 scale codes, or float32 values when the recipe keeps exact scales;
    global_scale: float32 scalar tensor (1 without a per-tensor scale); shape: the original shape."""

    codes: torch.Tensor
    scales: torch.Tensor
    global_scale: torch.Tensor
    shape: tuple[int, ...]
    recipe: BlockRecipe

    def scale_values(self) -> torch.Tensor:
        """Block scales as float64 values [..., Kp / k] (without the global scale)."""
        fmt = self.recipe.scale
        return self.scales.double() if fmt is None else fmt.decode(self.scales, torch.float64)

    def dequantize(self) -> torch.Tensor:
        """float32 tensor of the original shape, x_hat = q * s_b * S rounded once.

        With a minifloat scale, q * s_b has at most 6 significant bits and so is exact in float32; multiplying by S
        is then the single rounding. Exact (fp32) scales go through float64 for the same single rounding."""
        with limit_threads(QUANT_NUM_THREADS):
            return self._dequantize()

    def _dequantize(self) -> torch.Tensor:
        k = self.recipe.block_size
        dtype = torch.float64 if self.recipe.scale is None else torch.float32
        q = self.recipe.element.decode(self.codes, dtype)
        q = q.reshape(*q.shape[:-1], q.size(-1) // k, k)
        x = q * self.scale_values().to(dtype).unsqueeze(-1)
        if self.recipe.global_scale:
            x = x * self.global_scale.to(dtype)
        x = x.reshape(*x.shape[:-2], -1)[..., : self.shape[-1]]
        return x.to(torch.float32).reshape(self.shape)


def quantize(x: torch.Tensor, recipe: BlockRecipe, pad: bool = False) -> QuantizedTensor:
    """Block-quantize `x` [..., K] along its last dimension. Non-finite input raises `NumericalError`."""
    with limit_threads(QUANT_NUM_THREADS):
        return _quantize(x, recipe, pad)


def _quantize(x: torch.Tensor, recipe: BlockRecipe, pad: bool) -> QuantizedTensor:
    blocks, shape = _blocks(x, recipe.block_size, pad)
    amax = blocks.abs().amax(dim=-1)  # [..., nb]
    if recipe.scale is E8M0:
        scales, reciprocal = _power_of_two_scales(amax, recipe)
        global_scale = torch.tensor(1.0)
    else:
        scales, reciprocal, global_scale = _minifloat_scales(amax, recipe)
    codes = recipe.element.encode(blocks * reciprocal.unsqueeze(-1), saturate=True)
    return QuantizedTensor(codes.reshape(*codes.shape[:-2], -1), scales, global_scale, shape, recipe)


def _blocks(x: torch.Tensor, k: int, pad: bool) -> tuple[torch.Tensor, tuple[int, ...]]:
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point or x.dim() == 0:
        raise InvalidInputError(f"quantize wants a floating-point tensor with at least one dimension, got "
                                f"{getattr(x, 'dtype', type(x).__name__)} of shape {tuple(getattr(x, 'shape', ()))}")
    if x.numel() == 0:
        raise InvalidInputError(f"cannot block-quantize an empty tensor (shape {tuple(x.shape)}): there are no values to scale")
    bad = ~torch.isfinite(x)
    if bad.any():
        raise NumericalError(f"cannot block-quantize a tensor with {int(bad.sum())} NaN/Inf value(s) of {x.numel()}; "
                             f"a block scale would be meaningless. Clean the tensor first")
    shape = tuple(x.shape)
    x = x.detach().float()
    rest = x.size(-1) % k
    if rest:
        if not pad:
            raise InvalidInputError(f"last dimension {x.size(-1)} is not a multiple of the block size {k}; pass pad=True "
                                    f"to pad it with zeros (cropped again on dequantize) or pick a block size dividing it")
        x = torch.nn.functional.pad(x, (0, k - rest))
    return x.reshape(*x.shape[:-1], x.size(-1) // k, k), shape


def _floor_log2(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact floor(log2 v) for v > 0 (int64; zeros get a very small exponent) and the significand v / 2^floor in [1, 2)."""
    mantissa, exponent = torch.frexp(v)  # v = mantissa * 2^exponent, mantissa in [0.5, 1)
    floor = (exponent - 1).long()
    return torch.where(v > 0, floor, torch.full_like(floor, -10_000)), mantissa * 2


def _power_of_two_scales(amax: torch.Tensor, recipe: BlockRecipe) -> tuple[torch.Tensor, torch.Tensor]:
    """E8M0 codes [..., nb] and the exact reciprocals 2^-e of the block scales (float32)."""
    emax = recipe.element.emax
    if recipe.scale_rule == "rceil":
        descale = amax / recipe.element.max  # float32, as the hardware rule computes it
        floor, significand = _floor_log2(descale)
        exponent = floor + (significand > 1).long()
    else:
        floor, significand = _floor_log2(amax)
        if recipe.scale_rule == "ceil":
            floor = floor + (significand > 1).long()
        elif recipe.scale_rule == "even":  # amax rounds up to the next power of two when its significand would
            floor = floor + (significand >= 2 - 2.0 ** -(recipe.element.mbits + 1)).long()  # round to 2 at mbits
        exponent = floor - emax
    exponent = exponent.clamp(E8M0_EXP_MIN, E8M0_EXP_MAX)
    codes = (exponent - E8M0_EXP_MIN).to(torch.uint8)
    reciprocal = torch.ldexp(torch.ones_like(amax), (-exponent).to(amax.dtype))
    return codes, reciprocal


def global_scale_for(tensor_amax: torch.Tensor | float, recipe: BlockRecipe) -> torch.Tensor:
    """The per-tensor fp32 scale S = amax / (max_elem * max_scale) that maps the largest block scale onto the scale
    format's maximum; 1 without a global scale, and for an all-zero tensor (every block is zero whatever S is)."""
    tensor_amax = torch.as_tensor(tensor_amax, dtype=torch.float32)
    if not recipe.global_scale:
        return torch.tensor(1.0)
    top = recipe.element.max * (recipe.scale.max if recipe.scale else 1.0)
    return torch.where(tensor_amax > 0, tensor_amax / top, torch.tensor(1.0)).float()


def effective_scales(amax: torch.Tensor, recipe: BlockRecipe, global_scale: torch.Tensor | float | None = None) -> torch.Tensor:
    """The scale each block of max-magnitude `amax` (float32, any shape) really gets, s_b * S, in float64; 0 where
    the scale underflows. `global_scale` defaults to the one `amax` itself implies. Used by the error model."""
    amax = amax.float()
    if recipe.scale is E8M0:
        _, reciprocal = _power_of_two_scales(amax, recipe)
        return 1.0 / reciprocal.double()
    scales, _, s = _minifloat_scales(amax, recipe, None if global_scale is None else torch.as_tensor(global_scale).float())
    values = scales.double() if recipe.scale is None else recipe.scale.decode(scales, torch.float64)
    return values * s.double()


def _minifloat_scales(amax: torch.Tensor, recipe: BlockRecipe, global_scale: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scale codes (or fp32 values), the fp32 multipliers (1 / S) / s_b, and the global scale S."""
    s_star = amax / recipe.element.max  # float32, the ideal block scale
    fmt = recipe.scale
    if global_scale is None:
        global_scale = global_scale_for(amax.max() if amax.numel() else 0.0, recipe)
    if recipe.global_scale:
        s_star = s_star / global_scale
    if fmt is None:
        s_hat, scales = s_star, s_star
    else:
        if recipe.clamp_scale_to_min_normal:
            s_star = s_star.clamp(min=fmt.min_normal, max=fmt.max)
        scales = fmt.encode(s_star, saturate=True)
        s_hat = fmt.decode(scales, torch.float32)
    inv_global = 1.0 / global_scale if recipe.global_scale else None
    safe = torch.where(s_hat > 0, s_hat, torch.ones_like(s_hat))
    reciprocal = (inv_global / safe) if inv_global is not None else (1.0 / safe)
    reciprocal = torch.where(s_hat > 0, reciprocal, torch.zeros_like(reciprocal))  # a zero scale flushes its block
    return scales, reciprocal, global_scale
