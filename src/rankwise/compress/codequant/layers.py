"""The two kinds of quantized linear CodeQuant's pipeline and its baselines put in a model.

Both quantize their input per token (`act_quant.fake_quant`, A-b) when `act_bits` is set:

    RoundedLinear    a fixed weight already on its grid (RTN, GPTQ, SmoothQuant's) or left FP, stored dequantized
    ClusteredLinear  per-(row, group) codebooks: codes a [out, in] in [0, k) and centroids C [out, in / group, k];
                     the weight is W_c[i, j] = C[i, j // group, a_ij], so a row (group) holds at most k values

A ClusteredLinear under fine-tuning keeps the FP weight it was clustered from (`source`), since the paper's loop
re-assigns the FP weights to the updated centroids after every step; `drop_source` frees it for deployment.

Inference on few tokens (decoding: at most `LUT_MAX_TOKENS` rows, no gradient, 4-bit codes, quantized inputs) goes
through the lookup-table kernel (`lut.lut_matmul`, equal to the reference to fp32 rounding); larger batches
dequantize once and use the BLAS matmul, which is faster there.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.compress.codequant.act_quant import check_bits, fake_quant
from rankwise.compress.codequant.kmeans import assign, kmeans_rows
from rankwise.compress.codequant.lut import kernel_available, lut_matmul, pack_codes
from rankwise.errors import InvalidInputError

LUT_MAX_TOKENS = 16  # the benchmark: the kernel beats dequantize + fp32 matmul up to about this batch


def _act_bits(bits: int | None) -> int | None:
    if bits is not None:
        check_bits(bits)
    return bits


class RoundedLinear(nn.Module):
    """y = Q_a(x) Wᵀ + b with a fixed weight `[out, in]` (already quantized, or FP for activation-only runs)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, act_bits: int | None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.act_bits = _act_bits(act_bits)
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if self.act_bits is not None:
            x = fake_quant(x, self.act_bits)
        return F.linear(x, self.weight, self.bias)


def check_group(in_features: int, group: int | None) -> int:
    g = in_features if group is None else group
    if isinstance(g, bool) or not isinstance(g, int) or g < 1 or in_features % g:
        raise InvalidInputError(f"weight group {group!r} must be a positive divisor of the input size {in_features}")
    return g


class ClusteredLinear(nn.Module):
    """A linear whose weight is a per-(row, group) codebook of `k` centroids (4-bit codes for k = 16)."""

    def __init__(self, codes: torch.Tensor, centroids: torch.Tensor, bias: torch.Tensor | None, act_bits: int | None,
                 source: torch.Tensor | None = None) -> None:
        super().__init__()
        out, groups, k = centroids.shape
        if codes.dim() != 2 or codes.shape[0] != out or codes.shape[1] % groups:
            raise InvalidInputError(f"codes {tuple(codes.shape)} do not fit centroids {tuple(centroids.shape)}")
        if codes.dtype != torch.uint8 or int(codes.max()) >= k:
            raise InvalidInputError(f"codes must be uint8 in [0, {k})")
        self.register_buffer("codes", codes.contiguous())
        self.centroids = nn.Parameter(centroids.detach().clone().float())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.register_buffer("source", None if source is None else source.detach().clone().float())
        self.act_bits = _act_bits(act_bits)
        self.in_features, self.out_features = codes.shape[1], out
        self.group_size, self.k = codes.shape[1] // groups, k

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None, k: int = 16, group: int | None = None,
                    act_bits: int | None = 4, iters: int = 300, seed: int = 42, keep_source: bool = False
                    ) -> "ClusteredLinear":
        """k-means (k-means++ init, Lloyd) of every row, or of every `group` consecutive inputs of a row."""
        out, inp = weight.shape
        gs = check_group(inp, group)
        values = weight.detach().float().reshape(out * (inp // gs), gs)
        centroids, codes = kmeans_rows(values, k, iters=iters, seed=seed)
        return cls(codes.reshape(out, inp), centroids.reshape(out, inp // gs, k), bias, act_bits,
                   weight if keep_source else None)

    def dequantized(self) -> torch.Tensor:
        """W_c [out, in]: each weight its centroid (differentiable in the centroids)."""
        out, groups, _ = self.centroids.shape
        idx = self.codes.view(out, groups, self.group_size).long()
        return torch.gather(self.centroids, 2, idx).reshape(out, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if self._lut_ready(x):
            y = lut_matmul(x, self._packed_codes(), self._lut_centroids(), self.act_bits)
            return y if self.bias is None else y + self.bias
        if self.act_bits is not None:
            x = fake_quant(x, self.act_bits)
        return F.linear(x, self.dequantized(), self.bias)

    def _lut_ready(self, x: torch.Tensor) -> bool:
        return (self.act_bits is not None and not torch.is_grad_enabled() and x.dtype == torch.float32
                and x.numel() // self.in_features <= LUT_MAX_TOKENS and self.in_features % 2 == 0 and self.k <= 16
                and kernel_available())

    def _packed_codes(self) -> torch.Tensor:
        version = self.codes._version  # re-packed only after the codes change (re-assignment)
        if getattr(self, "_packed_cache", (None,))[0] != version:
            self._packed_cache = (version, pack_codes(self.codes))
        return self._packed_cache[1]

    def _lut_centroids(self) -> torch.Tensor:
        c = self.centroids.detach()
        return c if self.k == 16 else F.pad(c, (0, 16 - self.k))  # codes < k never read the padding

    def cluster_sizes(self) -> torch.Tensor:
        """How many weights each centroid holds, [out, groups, k] float."""
        out, groups, k = self.centroids.shape
        idx = self.codes.view(out, groups, self.group_size).long()
        return torch.zeros(out, groups, k).scatter_add_(2, idx, torch.ones(idx.shape))

    @torch.no_grad()
    def reassign_(self) -> None:
        """Re-assign every FP source weight to its nearest (updated) centroid; centroids are re-sorted first."""
        if self.source is None:
            raise InvalidInputError("this clustered layer kept no FP source weight to re-assign")
        out, groups, k = self.centroids.shape
        self.centroids.copy_(self.centroids.sort(-1).values)
        flat = self.centroids.reshape(out * groups, k)
        codes = assign(self.source.reshape(out * groups, self.group_size), flat)
        self.codes.copy_(codes.reshape(out, self.in_features).to(torch.uint8))

    def drop_source(self) -> None:
        self.source = None
