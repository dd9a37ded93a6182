"""The universal-TTA metric: the H-score (AH), the harmonic mean of known-class accuracy and unknown-rejection
accuracy, and its parts. Labels and predictions use UNKNOWN (-1) for "a new class"."""

from __future__ import annotations

import math

import torch

from rankwise.apps.vision.emac.losses import UNKNOWN


def open_set_scores(pred: torch.Tensor, truth: torch.Tensor) -> dict[str, float]:
    """{"known_acc", "unknown_acc", "h_score"} in points for predictions [N] and truths [N] (class or UNKNOWN).
    A part with no samples is NaN, and so is the H-score then (it needs both kinds)."""
    known, unknown = truth != UNKNOWN, truth == UNKNOWN
    a = 100.0 * float((pred[known] == truth[known]).double().mean()) if known.any() else math.nan
    b = 100.0 * float((pred[unknown] == UNKNOWN).double().mean()) if unknown.any() else math.nan
    h = math.nan if math.isnan(a) or math.isnan(b) else (0.0 if a + b == 0 else 2 * a * b / (a + b))
    return {"known_acc": a, "unknown_acc": b, "h_score": h}
