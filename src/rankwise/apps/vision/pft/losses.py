"""PFT's losses (card pft-fer.md; the authors' `losses.py`): expression consistency, Gram / style / moment statistics.

Reading of the authors' Gram-loss bug (card, "Code bug"): `train_source.py` compares Gram(F(x_a)) with Gram(F(x_b)),
neither of which depends on T. Here the style statistic is always taken of T's output and compared with the
reference subject's statistic, so the loss trains T.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from rankwise.errors import InvalidInputError

EMOTION_LOSSES = ("ce", "mse", "kl")


def emotion_loss(original_logits: torch.Tensor, translated_logits: torch.Tensor, kind: str = "ce") -> torch.Tensor:
    """L_expr: the classifier's prediction on translated features must match its prediction on the untranslated ones.
    logits [N, classes] each; `original_logits` is the target (no gradient). "ce": CE against argmax of the original
    (the code's default), minus the original's own CE against its argmax (a constant: no gradient changes, but the
    loss is 0 when T is the identity); "mse": MSE of logits;
    "kl": KL(original softmax || translated softmax)."""
    if original_logits.shape != translated_logits.shape:
        raise InvalidInputError(f"logit shapes differ: {tuple(original_logits.shape)} vs {tuple(translated_logits.shape)}")
    target = original_logits.detach()
    if kind == "ce":
        return F.cross_entropy(translated_logits, target.argmax(1)) - F.cross_entropy(target, target.argmax(1))
    if kind == "mse":
        return F.mse_loss(translated_logits, target)
    if kind == "kl":
        return F.kl_div(F.log_softmax(translated_logits, 1), F.log_softmax(target, 1), log_target=True, reduction="batchmean")
    raise InvalidInputError(f"emotion loss kind must be one of {EMOTION_LOSSES}, got {kind!r}")


def gram_matrix(x: torch.Tensor) -> torch.Tensor:
    """Second-order style statistic. Features [N, D] -> [D, D] = X^T X / N (the batch's uncentred feature
    correlations: a subject's style over its frames); feature maps [N, C, H, W] -> [N, C, C] = F F^T / (H W) per image
    (the authors' per-layer Gram). Symmetric positive semi-definite by construction."""
    if x.dim() == 2:
        return x.T @ x / x.shape[0]
    if x.dim() == 4:
        flat = x.flatten(2)
        return flat @ flat.transpose(1, 2) / flat.shape[2]
    raise InvalidInputError(f"gram_matrix takes features [N, D] or maps [N, C, H, W], got shape {tuple(x.shape)}")


def gram_loss(translated: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """MSE between the Gram matrix of T's output [N, D] and the reference subject's [M, D] (batch sizes may differ)."""
    return F.mse_loss(gram_matrix(translated), gram_matrix(reference).detach())


def style_loss(translated: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """The code's `style_loss`: squared distance of the per-dimension mean and std of T's output [N, D] from the
    reference's [M, D]; 0 when the statistics are identical."""
    m1, m2 = translated.mean(0), reference.detach().mean(0)
    s1, s2 = translated.std(0, unbiased=False), reference.detach().std(0, unbiased=False)
    return F.mse_loss(m1, m2) + F.mse_loss(s1, s2)


def moment_loss(original: torch.Tensor, translated: torch.Tensor) -> torch.Tensor:
    """The code's `moment_loss`: batch mean and std of the original features [N, D] against the translated [N, D]
    (keeps T from drifting the batch's first two moments)."""
    return style_loss(translated, original)


__all__ = ["EMOTION_LOSSES", "emotion_loss", "gram_matrix", "gram_loss", "style_loss", "moment_loss"]
