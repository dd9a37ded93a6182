"""torchao parity on real weights: the NVFP4, MXFP4 and single-level UE4M3 codecs against torchao's CPU reference.

Counted per block: a block agrees when its scale byte and all its element codes equal torchao's. Where a recipe's
documented difference applies (torchao's single-level NVFP4 clamps scales up to 2^-6; the paper's UE4M3 flushes or
keeps them subnormal), only blocks with a normal ideal scale are compared, and the report says how many.
"""

from __future__ import annotations

import warnings

import torch

from rankwise.quant.block import get_recipe, quantize
from rankwise.core.packing import unpack_nibbles


def _torchao():
    """torchao's MX/NVFP4 reference quantizers, or None where torchao is not installed."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torchao.prototype.mx_formats.config import ScaleCalculationMode
            from torchao.prototype.mx_formats.mx_tensor import to_mx
            from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale
    except ImportError:
        return None
    return to_mx, ScaleCalculationMode, nvfp4_quantize, per_tensor_amax_to_scale


def available() -> bool:
    return _torchao() is not None


def parity_mismatches(weights: list[tuple[str, torch.Tensor]], alphas: dict[str, float]) -> dict[str, tuple[int, int]]:
    """{"nvfp4" | "mxfp4" | "ue4m3-normal-blocks": (mismatching blocks, compared blocks)} over alpha_t * W_t,
    tensors [out, in] whose in-dimension is a multiple of 32."""
    to_mx, mode, nvfp4_quantize, per_tensor_scale = _torchao()
    out = {"nvfp4": [0, 0], "mxfp4": [0, 0], "ue4m3-normal-blocks": [0, 0]}
    for n, w in weights:
        x = (w.detach().float() * alphas[n]).contiguous()
        if x.shape[-1] % 32:
            continue
        # NVFP4 (two-level, k = 16)
        q = quantize(x, get_recipe("nvfp4"))
        scale, data = nvfp4_quantize(x, 16, per_tensor_scale(x.abs().max()))
        _count(out["nvfp4"], q.scales, scale.view(torch.uint8), q.codes, unpack_nibbles(data), 16)
        # MXFP4 (OCP floor rule, k = 32)
        q = quantize(x, get_recipe("mxfp4", 32))
        scale, data = to_mx(x, torch.float4_e2m1fn_x2, 32, mode.FLOOR)
        _count(out["mxfp4"], q.scales, scale.view(torch.uint8), q.codes, unpack_nibbles(data.view(torch.uint8)), 32)
        # single-level UE4M3 (the paper's "UE4M3", no global scale) where its ideal scales are normal
        q = quantize(x, get_recipe("fp4-ue4m3", 16))
        scale, data = nvfp4_quantize(x, 16, None)
        normal = (x.reshape(-1, 16).abs().amax(-1) / 6 >= 2.0**-6)
        _count(out["ue4m3-normal-blocks"], q.scales.reshape(-1)[normal], scale.view(torch.uint8).reshape(-1)[normal],
               q.codes.reshape(-1, 16)[normal], unpack_nibbles(data).reshape(-1, 16)[normal], 16)
    return {k: (v[0], v[1]) for k, v in out.items()}


def _count(acc: list[int], scales, ref_scales, codes, ref_codes, k: int) -> None:
    s_ok = scales.reshape(-1) == ref_scales.reshape(-1)
    c_ok = (codes.reshape(-1, k) == ref_codes.reshape(-1, k)).all(-1)
    acc[0] += int((~(s_ok & c_ok)).sum())
    acc[1] += int(s_ok.numel())
