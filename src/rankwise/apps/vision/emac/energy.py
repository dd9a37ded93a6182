"""EMAC's first step, exposing the mixture: the SVD split of the source classifier into what it can see (the row
space of W_cls) and what it cannot (the orthogonal complement), and the "unknown energy" of a feature.

    split = split_classifier(head.weight)        # W_cls [C, D] -> bases F_known [D, C], F_unknown [D, D - C]
    e = split.unknown_energy(z)                  # z [B, D] (any norm) -> e [B] in [0, 1]

For a unit z, ||F_known^T z||^2 + ||F_unknown^T z||^2 = 1 (the two bases together are an orthonormal basis of R^D),
and W_cls = W_cls P_known with P_known = F_known F_known^T: the classifier reads only the known part, so a feature
whose energy lies in the complement is one the source classifier is blind to (new classes, card step 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from rankwise.errors import InvalidInputError

RANK_TOL = 1e-10  # relative singular-value floor: a classifier of lower rank than C is refused, not padded


@dataclass(frozen=True)
class EnergySplit:
    """Orthonormal bases (float64) of the classifier's row space (`known` [D, C]) and its complement
    (`unknown` [D, D - C])."""

    known: torch.Tensor
    unknown: torch.Tensor

    @property
    def dim(self) -> int:
        return int(self.known.shape[0])

    def projector_known(self) -> torch.Tensor:
        """P_known = F_known F_known^T [D, D] (float64)."""
        return self.known @ self.known.T

    def energies(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(known energy [B], unknown energy [B]) of the L2-normalised rows of z [B, D]; each pair sums to 1."""
        if z.dim() != 2 or z.shape[1] != self.dim:
            raise InvalidInputError(f"features must be [B, {self.dim}], got {tuple(z.shape)}")
        u = torch.nn.functional.normalize(z.detach().double(), dim=1)
        return (u @ self.known).pow(2).sum(1), (u @ self.unknown).pow(2).sum(1)

    def unknown_energy(self, z: torch.Tensor) -> torch.Tensor:
        """e = ||F_unknown^T z/||z|| ||^2 [B] (float64), low for old classes and high for new ones."""
        return self.energies(z)[1]


def split_classifier(weight: torch.Tensor) -> EnergySplit:
    """The SVD split of W_cls [C, D] (torch's [out, in] layout), in float64: W = U S V^T, F_known = the first C right
    singular vectors, F_unknown the other D - C. Needs C < D (else the unknown subspace is empty) and full row rank."""
    if weight.dim() != 2:
        raise InvalidInputError(f"the classifier weight must be [C, D], got {tuple(weight.shape)}")
    c, d = weight.shape
    if c >= d:
        raise InvalidInputError(f"EMAC needs a feature dimension D larger than the number of known classes C (the unknown "
                                f"subspace has D - C dimensions), got C = {c}, D = {d}: read a wider penultimate layer")
    w = weight.detach().double()
    if not torch.isfinite(w).all():
        raise InvalidInputError("the classifier weight has non-finite entries")
    _, s, vh = torch.linalg.svd(w, full_matrices=True)
    if s.numel() == 0 or float(s[-1]) <= RANK_TOL * float(s[0]):
        raise InvalidInputError(f"the classifier weight has rank below C = {c} (singular values {s.tolist()}): its "
                                "row space does not have C dimensions")
    v = vh.T  # [D, D], columns = right singular vectors
    return EnergySplit(known=v[:, :c].contiguous(), unknown=v[:, c:].contiguous())


def find_classifier(model: nn.Module) -> nn.Linear:
    """The model's linear classifier: its `head` (or `fc` / `classifier`) if that is an nn.Linear, else its last
    nn.Linear. The features EMAC reads are this layer's input."""
    for name in ("head", "fc", "classifier"):
        layer = getattr(model, name, None)
        if isinstance(layer, nn.Linear):
            return layer
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise InvalidInputError(f"{type(model).__name__} has no linear classifier layer (EMAC splits the classifier "
                                "weight W [C, D]): give the model a final nn.Linear head")
    return linears[-1]


class FeatureTap:
    """Captures the classifier's input on every forward: `logits = model(x)` then `tap.features` [B, D], with the
    autograd graph (so the contrastive loss can train through it)."""

    def __init__(self, classifier: nn.Linear) -> None:
        self.features: torch.Tensor | None = None
        self._handle = classifier.register_forward_hook(self._hook)

    def _hook(self, module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        self.features = inputs[0].flatten(1)

    def remove(self) -> None:
        self._handle.remove()
