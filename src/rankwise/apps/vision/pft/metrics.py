"""Per-subject expression metrics (points): accuracy, macro-F1 over {neutral, expressive}, expressive-class recall."""

from __future__ import annotations

import torch
from torch import nn

from rankwise.errors import InvalidInputError

NEUTRAL, EXPRESSIVE = 0, 1


def scores(predictions: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """predictions, labels [N] in {0, 1} -> accuracy, macro_f1, expressive_recall, neutral_recall (points). A class
    with no predicted and no true sample has F1 0 (so predicting one class everywhere has macro-F1 <= 50)."""
    if predictions.shape != labels.shape or predictions.dim() != 1 or labels.numel() == 0:
        raise InvalidInputError(f"predictions {tuple(predictions.shape)} and labels {tuple(labels.shape)} must be equal 1-D, non-empty")
    out = {"accuracy": 100.0 * float((predictions == labels).float().mean())}
    f1s = []
    for c, name in ((NEUTRAL, "neutral"), (EXPRESSIVE, "expressive")):
        tp = float(((predictions == c) & (labels == c)).sum())
        fp = float(((predictions == c) & (labels != c)).sum())
        fn = float(((predictions != c) & (labels == c)).sum())
        out[f"{name}_recall"] = 100.0 * tp / (tp + fn) if tp + fn else float("nan")
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    out["macro_f1"] = 100.0 * sum(f1s) / 2
    return out


@torch.no_grad()
def expression_metrics(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, batch: int = 256) -> dict[str, float]:
    """Evaluate `model` (images [N, C, H, W] -> logits [N, 2]) in eval mode on labelled frames; see `scores`."""
    was = model.training
    model.eval()
    preds = torch.cat([model(images[i:i + batch]).argmax(1) for i in range(0, images.shape[0], batch)])
    model.train(was)
    return scores(preds, labels)


__all__ = ["scores", "expression_metrics"]
