"""Two 4-bit codes per byte (microscaling FP4 elements, CodeQuant's centroid codes). Element 2i goes to the low
nibble and element 2i+1 to the high nibble of byte i, the layout torchao and the OCP MX reference use, so packed FP4
tensors compare byte for byte."""

from __future__ import annotations

import torch

from rankwise.errors import InvalidInputError


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes in 0..15, shape [..., K] with K even -> uint8 [..., K / 2]."""
    if codes.dtype != torch.uint8:
        raise InvalidInputError(f"pack_nibbles wants uint8 codes, got {codes.dtype}")
    if codes.dim() == 0 or codes.size(-1) % 2:
        raise InvalidInputError(f"pack_nibbles needs an even last dimension, got shape {tuple(codes.shape)}; pad it first")
    if codes.numel() and int(codes.max()) > 15:
        raise InvalidInputError(f"pack_nibbles codes must be 4-bit (0..15); found {int(codes.max())}")
    pairs = codes.reshape(*codes.shape[:-1], codes.size(-1) // 2, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K / 2] -> uint8 codes [..., K] (the inverse of `pack_nibbles`)."""
    if packed.dtype != torch.uint8:
        raise InvalidInputError(f"unpack_nibbles wants uint8 bytes, got {packed.dtype}")
    if packed.dim() == 0:
        raise InvalidInputError("unpack_nibbles needs at least one dimension")
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(*packed.shape[:-1], packed.size(-1) * 2)
