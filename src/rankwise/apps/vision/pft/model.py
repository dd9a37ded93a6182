"""The source model split into F (features) -> B (bottleneck) -> C (classifier), and the feature translator T.

PFT inserts T between F and B: logits = C(B(T(F(x)))). F, B and C are frozen in both stages; only T trains.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from rankwise.errors import InvalidInputError


class SourceModel(nn.Module):
    """F -> B -> C. `features`: images [N, ...] -> [N, D]; `bottleneck`: [N, D] -> [N, K]; `classifier`: [N, K] -> [N, classes]."""

    def __init__(self, features: nn.Module, bottleneck: nn.Module, classifier: nn.Module):
        super().__init__()
        self.features, self.bottleneck, self.classifier = features, bottleneck, classifier

    def head(self, feats: torch.Tensor) -> torch.Tensor:
        """C(B(feats)): [N, D] -> logits [N, classes]."""
        return self.classifier(self.bottleneck(feats))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def as_source_model(module: nn.Module) -> SourceModel:
    """`module` as F -> B -> C: a SourceModel, a module with `features`, `bottleneck` (optional) and `classifier`
    attributes, or an nn.Sequential whose last layer is an nn.Linear (the classifier; B = identity). Raises
    InvalidInputError for a model with no classifier layer."""
    if isinstance(module, SourceModel):
        return module
    if isinstance(getattr(module, "classifier", None), nn.Module) and isinstance(getattr(module, "features", None), nn.Module):
        bottleneck = getattr(module, "bottleneck", None)
        return SourceModel(module.features, bottleneck if isinstance(bottleneck, nn.Module) else nn.Identity(), module.classifier)
    if isinstance(module, nn.Sequential) and len(module) >= 2 and isinstance(module[-1], nn.Linear):
        return SourceModel(module[:-1], nn.Identity(), module[-1])
    raise InvalidInputError(f"{type(module).__name__} has no classifier layer PFT can find: pass a module with `features` and "
                            "`classifier` (and optionally `bottleneck`) attributes, or an nn.Sequential ending in nn.Linear")


def frozen_copy(model: SourceModel) -> SourceModel:
    """A deep copy in eval mode with every parameter frozen (F, B and C never receive gradients)."""
    out = copy.deepcopy(model).eval()
    for p in out.parameters():
        p.requires_grad_(False)
    return out


class FeatureTranslator(nn.Module):
    """T: a residual MLP on F's features, T(f) = f + W2 relu(W1 f + b1) + b2, [N, D] -> [N, D]. The last layer starts
    at zero, so T is the identity at initialisation (the card's allowed option; the paper's T is Linear-ReLU-Linear)."""

    def __init__(self, dim: int, hidden: int | None = None):
        super().__init__()
        if dim < 1:
            raise InvalidInputError(f"feature dim must be positive, got {dim}")
        self.inner = nn.Linear(dim, hidden or dim)
        self.outer = nn.Linear(hidden or dim, dim)
        nn.init.zeros_(self.outer.weight)
        nn.init.zeros_(self.outer.bias)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        return feats + self.outer(torch.relu(self.inner(feats)))


class TranslatedModel(nn.Module):
    """The deployed PFT model: C(B(T(F(x)))), images -> logits. Only `translator` is trainable."""

    def __init__(self, source: SourceModel, translator: FeatureTranslator):
        super().__init__()
        self.source, self.translator = source, translator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.source.head(self.translator(self.source.features(x)))

    def train(self, mode: bool = True) -> TranslatedModel:
        super().train(mode)
        self.source.eval()  # the frozen source keeps its BN statistics whatever the caller's mode
        return self


__all__ = ["SourceModel", "as_source_model", "frozen_copy", "FeatureTranslator", "TranslatedModel"]
