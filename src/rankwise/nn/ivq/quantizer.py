"""Vector quantisation of patch tokens against a codebook: the implicit regulariser IVQ (the quantised tokens are
discarded, only the loss acts) and the explicit VQ it is compared with (the quantised tokens go forward).

For patch tokens z_j (rows of Z_p) and a codebook C [M, D], each patch picks its nearest codeword
k_j = argmin_k ||z_j - c_k||^2 and Z_q = [c_{k_j}]_j. The loss (IVQ-CBM's `vector_quantizer`, MSE means):

    L_VQ = mean ||sg(Z_p) - Z_q||^2  +  beta * mean ||Z_p - sg(Z_q)||^2
           (codebook term: moves only C)   (commitment term: moves only Z_p)

IVQ returns Z_p unchanged (forward logits are those without the regulariser), explicit VQ returns the
straight-through Z_p + sg(Z_q - Z_p) (values Z_q, gradients to Z_p), the classic VQ-VAE bottleneck.

`frozen_codebook=True` reproduces the released code, whose optimiser leaves the codebook out (it stays at its
uniform(-1/M, 1/M) init): the codebook term then does nothing and IVQ commits patches to fixed random anchors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from rankwise.errors import InvalidInputError


@dataclass
class QuantizerOutput:
    """forward's result: the tokens to pass on [B, L, D], the loss (scalar), the codes [B, L] (int64), and the two
    loss terms separately (scalars, for the stop-gradient checks and logging)."""

    tokens: torch.Tensor
    loss: torch.Tensor
    codes: torch.Tensor
    codebook_loss: torch.Tensor
    commitment_loss: torch.Tensor


def check_tokens(z: torch.Tensor, dim: int, what: str = "patch tokens") -> None:
    """Refuse anything but finite float tokens [B, L, dim] with L >= 1."""
    if z.dim() != 3 or z.shape[-1] != dim or z.shape[1] < 1:
        raise InvalidInputError(f"{what} must be [B, L, {dim}] with L >= 1, got {tuple(z.shape)}")
    if not z.is_floating_point():
        raise InvalidInputError(f"{what} must be floating point, got {z.dtype}")


def nearest_codes(z: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """argmin_k ||z_j - c_k||^2 per token. z [..., D], codebook [M, D] -> int64 [...]."""
    flat = z.detach().reshape(-1, z.shape[-1])
    d2 = (flat * flat).sum(-1, keepdim=True) - 2 * flat @ codebook.detach().T + (codebook.detach() ** 2).sum(-1)
    return d2.argmin(-1).view(z.shape[:-1])


def vq_loss_terms(z: torch.Tensor, quantized: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(codebook term mean||sg(z) - q||^2, beta * commitment term mean||z - sg(q)||^2); z, quantized [..., D].
    MSE means over every element, as the authors' `F.mse_loss`."""
    codebook_term = torch.mean((z.detach() - quantized) ** 2)
    commitment_term = beta * torch.mean((z - quantized.detach()) ** 2)
    return codebook_term, commitment_term


class _Quantizer(nn.Module):
    """A codebook [M, D] initialised uniform(-1/M, 1/M) (the authors' init) and the VQ loss; subclasses decide what
    goes forward."""

    def __init__(self, num_codes: int, dim: int, beta: float = 1.0, frozen_codebook: bool = False) -> None:
        super().__init__()
        if num_codes < 1 or dim < 1:
            raise InvalidInputError(f"a codebook needs num_codes >= 1 and dim >= 1, got {num_codes} x {dim}")
        if not beta >= 0:
            raise InvalidInputError(f"the commitment weight beta must be >= 0, got {beta}")
        self.num_codes, self.dim, self.beta, self.frozen_codebook = num_codes, dim, float(beta), frozen_codebook
        self.codebook = nn.Parameter(torch.empty(num_codes, dim).uniform_(-1.0 / num_codes, 1.0 / num_codes),
                                     requires_grad=not frozen_codebook)

    def quantize(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(Z_q [B, L, D], codes [B, L], codebook term, commitment term) for tokens z [B, L, D]."""
        check_tokens(z, self.dim)
        codes = nearest_codes(z, self.codebook)
        quantized = self.codebook[codes]  # [B, L, D]; its gradient reaches the codebook rows chosen
        codebook_term, commitment_term = vq_loss_terms(z, quantized, self.beta)
        return quantized, codes, codebook_term, commitment_term

    def extra_repr(self) -> str:
        return f"num_codes={self.num_codes}, dim={self.dim}, beta={self.beta}, frozen_codebook={self.frozen_codebook}"


class ImplicitVQ(_Quantizer):
    """IVQ: z [B, L, D] -> QuantizerOutput whose `tokens` is z itself (Z_q is discarded); only `loss` acts."""

    def forward(self, z: torch.Tensor) -> QuantizerOutput:
        _, codes, cb, commit = self.quantize(z)
        return QuantizerOutput(z, cb + commit, codes, cb, commit)


class ExplicitVQ(_Quantizer):
    """Explicit VQ: z [B, L, D] -> QuantizerOutput whose `tokens` is Z_q with the straight-through gradient to z."""

    def forward(self, z: torch.Tensor) -> QuantizerOutput:
        quantized, codes, cb, commit = self.quantize(z)
        return QuantizerOutput(z + (quantized - z).detach(), cb + commit, codes, cb, commit)
