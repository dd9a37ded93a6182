"""Stage 0 and the fusion half of stage 1: fold the RMSNorm gains into the linears that read them, then rotate the
whole residual stream by one orthogonal R, leaving the function unchanged.

After folding, every norm computes x / rms(x), which commutes with an orthogonal R (rms(x R) = rms(x)). Rotating the
stream h -> h R then needs (weights `[out, in]`, y = x Wᵀ):

    readers (embeddings' rows, lm_head, q/k/v, router, expert gate/up):   W <- W R
    writers (o_proj, expert down_proj; their bias b too):                 W <- Rᵀ W,  b <- Rᵀ b

A tied lm_head is untied first: after folding the final norm's gain into it, it no longer equals the embeddings.
"""

from __future__ import annotations

import torch
from torch import nn

from rankwise.compress.codequant.structure import Decoder
from rankwise.errors import InvalidInputError


def _gain(norm: nn.Module) -> torch.Tensor:
    w = getattr(norm, "weight", None)
    if not isinstance(w, torch.Tensor):
        raise InvalidInputError(f"{type(norm).__name__} has no gain `weight`: cannot fold it (an RMSNorm is expected)")
    if getattr(norm, "bias", None) is not None:
        raise InvalidInputError(f"{type(norm).__name__} has a bias: only RMSNorm (gain, no bias) commutes with a rotation")
    return w


def untie_lm_head_(model: nn.Module, decoder: Decoder) -> None:
    """Give lm_head its own weight when it shares the embeddings' (SmolLM2 ties them)."""
    if decoder.lm_head.weight is decoder.embed.weight:
        decoder.lm_head.weight = nn.Parameter(decoder.embed.weight.detach().clone())
        config = getattr(model, "config", None)
        if config is not None and hasattr(config, "tie_word_embeddings"):
            config.tie_word_embeddings = False  # a saved folder must not re-tie them


@torch.no_grad()
def fold_norms_(model: nn.Module, decoder: Decoder) -> None:
    """Multiply each RMSNorm gain into the columns of its readers and set the gain to 1 (in place)."""
    untie_lm_head_(model, decoder)
    pairs = [(b.input_norm, b.attention_readers) for b in decoder.blocks]
    pairs += [(b.post_norm, b.mlp_readers) for b in decoder.blocks]
    pairs.append((decoder.final_norm, (decoder.lm_head,)))
    for norm, readers in pairs:
        g = _gain(norm)
        for lin in readers:
            lin.weight.mul_(g.to(lin.weight.dtype))
        g.fill_(1.0)


def check_rotation(r: torch.Tensor, d: int) -> None:
    if r.shape != (d, d):
        raise InvalidInputError(f"the rotation must be [{d}, {d}] (the hidden size), got {tuple(r.shape)}")
    eye = torch.eye(d, dtype=torch.float64)
    err = float((r.double().T @ r.double() - eye).abs().max())
    if not err < 1e-4:
        raise InvalidInputError(f"the rotation is not orthogonal (max |RᵀR - I| = {err:.2e})")


@torch.no_grad()
def fuse_rotation_(decoder: Decoder, r: torch.Tensor) -> None:
    """Rotate the residual stream by R [d, d] (orthogonal; norms already folded), in place, in float64 then cast."""
    check_rotation(r, decoder.hidden_size)
    r64 = r.double()

    def right(w: torch.Tensor) -> None:
        w.copy_((w.double() @ r64).to(w.dtype))

    right(decoder.embed.weight)
    right(decoder.lm_head.weight)
    for b in decoder.blocks:
        for lin in b.attention_readers + b.mlp_readers:
            right(lin.weight)
        for lin in b.writers:
            lin.weight.copy_((r64.T @ lin.weight.double()).to(lin.weight.dtype))
            if lin.bias is not None:
                lin.bias.copy_((r64.T @ lin.bias.double()).to(lin.bias.dtype))


def random_orthogonal(d: int, seed: int) -> torch.Tensor:
    """A Haar-random orthogonal [d, d] (QR of a Gaussian with the sign fix), float64 (orthogonal to float64 rounding,
    so fusing it into a float64 model is exact); the QuaRot-like rotation for any d (SmolLM2's 576 is not a power of
    two, so no plain Hadamard)."""
    g = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))
