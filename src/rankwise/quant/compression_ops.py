"""Compression operators C(θ₀) for compression-aware adapter training (CAR-LoRA): what a deployment does to the
frozen base of the adapted transformer blocks.

  identity  the uncompressed base
  int8      symmetric absmax INT8, one scale per output channel          (rankwise.quant.codebook)
  int4      symmetric absmax INT4, blocks of 32 along the input dim       (codebook)
  int3      symmetric absmax INT3, blocks of 32                           (codebook; held out in the reproduction)
  nf4       QLoRA NormalFloat-4, blocks of 64                             (codebook)
  fp4       E2M1 with an fp32 absmax scale per 64 (bitsandbytes' FP4)     (rankwise.quant.block, recipe fp4-fp32)
  mxfp4     OCP MXFP4: E2M1, E8M0 power-of-two scales per 32              (rankwise.quant.block)
  prune     structured pruning of the `ratio` lowest-norm MLP channels: the intermediate channel i is removed from
            the producers' outputs (gate/up rows) and the consumer's inputs (down columns); the mask acts on base
            and adapter alike, h = M (W₀ + s B A) x, so the adapter can neither write into a pruned channel nor read
            one. Channel score: the norm of the channel's producer rows, ||[W_gate[i], W_up[i]]||.
  skip      layer skipping: the chosen residual block returns its input (its adapters are skipped with it)

Quantizers act on every `nn.Linear` weight inside the compressed blocks (the base of an adapted layer, never its
adapter factors). Names may carry a parameter: `prune0.3` (ratio 0.3), `int4b64` (block 64), `nf4b32`, `skip`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from rankwise.errors import InvalidInputError, UnknownNameError
from rankwise.quant.block import get_recipe
from rankwise.quant.codebook import CodebookRecipe, fake_quantize_codebook
from rankwise.quant.fake_quant import fake_quantize

KINDS = ("identity", "quant", "prune", "skip")
DEFAULT_PRUNE_RATIO = 0.25
# The relative names, inside one block, of the MLP's producer layers (rows pruned) and its consumer (columns pruned).
MLP_LAYOUTS: dict[str, tuple[tuple[str, ...], str]] = {
    "llama": (("mlp.gate_proj", "mlp.up_proj"), "mlp.down_proj"),
    "bert": (("intermediate.dense",), "output.dense"),
}


@dataclass(frozen=True)
class CompressionOperator:
    """One operator: `kind` in KINDS; `codebook` (int / nf), `block_recipe` (fp4 / mxfp4) or `ratio` (prune)."""

    name: str
    kind: str
    codebook: CodebookRecipe | None = None
    block_recipe: str | None = None
    block_size: int | None = None
    ratio: float = DEFAULT_PRUNE_RATIO

    def compress_weight(self, w: torch.Tensor) -> torch.Tensor:
        """The quantized (dequantized-to-float32) copy of a base weight [out, in]; the input is not modified."""
        if self.kind != "quant":
            raise InvalidInputError(f"operator {self.name!r} ({self.kind}) does not quantize weights")
        if self.codebook is not None:
            return fake_quantize_codebook(w, self.codebook).to(w.dtype)
        return fake_quantize(w, get_recipe(self.block_recipe, self.block_size), pad=True).to(w.dtype)


_QUANT = re.compile(r"^(int|nf)(\d)(?:b(\d+))?$")
_FP4 = {"fp4": ("fp4-fp32", 64), "mxfp4": ("mxfp4", 32)}
_PRUNE = re.compile(r"^prune(0?\.\d+)?$")


def get_operator(name: str) -> CompressionOperator:
    """The operator a name stands for (see the module docstring); raises UnknownNameError otherwise."""
    if not isinstance(name, str):
        raise InvalidInputError(f"an operator name must be a string, got {name!r}")
    key = name.strip().lower()
    if key in ("identity", "none", "fp"):
        return CompressionOperator("identity", "identity")
    if key == "skip":
        return CompressionOperator("skip", "skip")
    m = _PRUNE.match(key)
    if m:
        ratio = float(m.group(1)) if m.group(1) else DEFAULT_PRUNE_RATIO
        if not 0.0 < ratio < 1.0:
            raise InvalidInputError(f"operator {name!r}: the pruning ratio must lie in (0, 1), got {ratio}")
        return CompressionOperator(key, "prune", ratio=ratio)
    if key in _FP4:
        recipe, block = _FP4[key]
        return CompressionOperator(key, "quant", block_recipe=recipe, block_size=block)
    m = _QUANT.match(key)
    if m:
        kind, bits = m.group(1), int(m.group(2))
        default_block = (None if bits == 8 else 32) if kind == "int" else 64  # int8: per-channel
        block = int(m.group(3)) if m.group(3) else default_block
        return CompressionOperator(key, "quant", codebook=CodebookRecipe(kind, bits, block))  # validates bits/block
    raise UnknownNameError(f"unknown compression operator {name!r}; known: identity, int8, int4, int3, nf4, nf3, fp4, "
                           f"mxfp4, prune, prune0.3 (any ratio), skip, and int<b>b<block> / nf<b>b<block>")


def parse_operators(spec: str | list[str] | tuple[str, ...]) -> tuple[CompressionOperator, ...]:
    """'int8,nf4,fp4,prune,skip' (or a list of names) -> operators, in order; duplicates and empties are refused."""
    names = [n.strip() for n in spec.split(",")] if isinstance(spec, str) else [str(n).strip() for n in spec]
    if not names or any(not n for n in names):
        raise InvalidInputError(f"operators must be a non-empty comma-separated list of names, got {spec!r}")
    ops = tuple(get_operator(n) for n in names)
    seen = [o.name for o in ops]
    if len(set(seen)) != len(seen):
        raise InvalidInputError(f"operators are listed twice: {seen}")
    return ops


def channel_scores(producers: list[torch.Tensor]) -> torch.Tensor:
    """Importance of each intermediate channel, float64 [d_ff]: the norm of its rows across the producer weights."""
    return torch.sqrt(sum(w.double().pow(2).sum(dim=1) for w in producers))


def prune_mask(producers: list[torch.Tensor], ratio: float) -> torch.Tensor:
    """Keep-mask [d_ff] (float 0/1, the producers' dtype) removing the round(ratio * d_ff) lowest-score channels."""
    scores = channel_scores(producers)
    n_prune = int(round(ratio * scores.numel()))
    if not 0 < n_prune < scores.numel():
        raise InvalidInputError(f"pruning ratio {ratio} of {scores.numel()} channels prunes {n_prune}: choose a ratio "
                                "that removes at least one channel and keeps at least one")
    mask = torch.ones_like(scores)
    mask[torch.argsort(scores, stable=True)[:n_prune]] = 0.0  # stable: ties are broken by channel index
    return mask.to(producers[0].dtype)
