"""PFT's two stages: stage 1 pre-trains T on cross-subject source pairs, stage 2 adapts T on one target person's
*neutral-only* frames (no source data). F, B and C stay frozen throughout (a frozen copy; the caller's model is
untouched), and every loop trains with the one `core.training.fit`.

    source = as_source_model(model)
    t = pretrain_translator(source, src_images, src_labels, src_subjects, PftConfig())       # stage 1 (optional)
    result = personalise(model, neutral_images, PftConfig(), translator=t)                   # stage 2
    expression_metrics(result.model, test_images, test_labels)
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.nn import functional as F

from rankwise.apps.vision.pft.config import PftConfig
from rankwise.apps.vision.pft.losses import emotion_loss, gram_loss, moment_loss, style_loss
from rankwise.apps.vision.pft.model import FeatureTranslator, SourceModel, TranslatedModel, as_source_model, frozen_copy
from rankwise.apps.vision.pft.pairs import cosine_partners
from rankwise.core.training import fit
from rankwise.errors import InvalidInputError

NEUTRAL = 0
# What the stage-2 loop receives, for tests and audits: (images [N, C, H, W], labels [N]).
Observer = Callable[[torch.Tensor, torch.Tensor], None]


def check_images(images: torch.Tensor, what: str, image_shape: tuple[int, ...] | None = None) -> None:
    """Refuse before any work: not a float tensor [N, C, H, W], empty, non-finite, outside [0, 1], or (when given)
    not `image_shape` (C, H, W)."""
    if not isinstance(images, torch.Tensor) or images.dim() != 4:
        got = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise InvalidInputError(f"{what} must be a tensor [N, C, H, W], got {got}")
    if images.shape[0] == 0:
        raise InvalidInputError(f"{what} is empty: give at least one frame")
    if not images.is_floating_point() or not bool(torch.isfinite(images).all()):
        raise InvalidInputError(f"{what} must be finite floats in [0, 1]")
    lo, hi = float(images.min()), float(images.max())
    if lo < 0 or hi > 1:
        raise InvalidInputError(f"{what} lie in [{lo:.3g}, {hi:.3g}]; scale them to [0, 1] (e.g. divide uint8 frames by 255)")
    if image_shape is not None and tuple(images.shape[1:]) != tuple(image_shape):
        raise InvalidInputError(f"{what} have shape {tuple(images.shape[1:])} per frame; the model reads {tuple(image_shape)}")


def check_neutral_labels(labels: torch.Tensor | None, n: int) -> None:
    """Stage 2 is neutral-only by definition: any label other than neutral (0) is refused."""
    if labels is None:
        return
    if labels.shape != (n,):
        raise InvalidInputError(f"target labels have shape {tuple(labels.shape)}; need one per frame ({n})")
    if bool((labels != NEUTRAL).any()):
        bad = int((labels != NEUTRAL).sum())
        raise InvalidInputError(f"{bad} of {n} target frames are not labelled neutral ({NEUTRAL}): PFT adapts on neutral frames "
                                "only; drop the expressive ones")


def _probe(source: SourceModel, images: torch.Tensor, what: str) -> int:
    """The feature dim D, from one frame; a frame the model cannot read is refused here, before any training."""
    try:
        with torch.no_grad():
            feats = source.features(images[:1])
            logits = source.head(feats)
    except RuntimeError as e:
        raise InvalidInputError(f"the model cannot read {what} of shape {tuple(images.shape[1:])}: {e}") from None
    if feats.dim() != 2 or logits.dim() != 2:
        raise InvalidInputError(f"F must return features [N, D] and C logits [N, classes]; got {tuple(feats.shape)}, {tuple(logits.shape)}")
    return int(feats.shape[1])


@torch.no_grad()
def features(source: SourceModel, images: torch.Tensor, batch: int = 256) -> torch.Tensor:
    """Frozen F features [N, D] in eval mode."""
    source.eval()
    return torch.cat([source.features(images[i:i + batch]) for i in range(0, images.shape[0], batch)])


def _style(kind: str, translated: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    return gram_loss(translated, reference) if kind == "gram" else style_loss(translated, reference)


def pretrain_translator(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, subjects: torch.Tensor,
                        config: PftConfig | None = None) -> FeatureTranslator:
    """Stage 1 on labelled source frames (images [N, C, H, W], labels [N], subjects [N]): each step draws two different
    subjects a, b, matches every frame of b to its most cosine-similar frame of a with the same label (frozen F
    features), and trains T so that T(F(x_b)) keeps b's prediction (L_expr) and takes a's style statistic (L_style:
    T's output vs a's partners, the bug-fixed Gram loss), plus lambda_moment * L_moment."""
    config = config or PftConfig()
    config.validate()
    source = frozen_copy(as_source_model(model))
    check_images(images, "source images")
    if labels.shape != (images.shape[0],) or subjects.shape != labels.shape:
        raise InvalidInputError("labels and subjects need one entry per source frame")
    ids = torch.unique(subjects)
    if ids.numel() < 2:
        raise InvalidInputError("stage 1 needs frames of at least two source subjects (it pairs across subjects)")
    dim = _probe(source, images, "source images")
    feats = features(source, images)
    with torch.no_grad():
        logits = source.head(feats)
    by_subject = [torch.nonzero(subjects == s).flatten() for s in ids]
    torch.manual_seed(config.seed)
    translator = FeatureTranslator(dim, config.hidden)
    g = torch.Generator().manual_seed(config.seed)

    def loss_at(step: int) -> torch.Tensor:
        a, b = torch.randperm(len(by_subject), generator=g)[:2].tolist()
        ib = by_subject[b][torch.randperm(by_subject[b].numel(), generator=g)[:config.batch_size]]
        partners = cosine_partners(feats[ib], labels[ib], feats[by_subject[a]], labels[by_subject[a]])
        fb, fa = feats[ib], feats[by_subject[a][partners]]
        tb = translator(fb)
        return (config.lambda_expr * emotion_loss(logits[ib], source.head(tb), config.emotion)
                + config.lambda_style * _style(config.style, tb, fa)
                + config.lambda_moment * moment_loss(fb, tb))

    fit(translator, loss_at, config.pretrain_steps, torch.optim.Adam(translator.parameters(), lr=config.pretrain_lr))
    return translator


@dataclass
class PftResult:
    """The adapted model C(B(T(F(x)))) (only T trained) and stage 2's losses per step."""

    model: TranslatedModel
    losses: list[float] = field(default_factory=list)


def personalise(model: torch.nn.Module, neutral_images: torch.Tensor, config: PftConfig | None = None,
                translator: FeatureTranslator | None = None, labels: torch.Tensor | None = None,
                observer: Observer | None = None) -> PftResult:
    """Stage 2: adapt T (a copy of `translator`, or the identity: PFT without stage 1) on one target person's neutral
    frames [N, C, H, W] in [0, 1]; `labels`, if given, must all be neutral. Loss: CE(C(B(T(f))), neutral) +
    lambda_expr L_expr(C(B(f)), C(B(T(f)))) + lambda_style L_style(T(f), f) (the target's own neutral statistics),
    mini-batches of `batch_size` frames. `observer(images, labels)` sees exactly what the loop receives."""
    config = config or PftConfig()
    config.validate()
    check_images(neutral_images, "target neutral images", config.image_shape)
    check_neutral_labels(labels, neutral_images.shape[0])
    source = frozen_copy(as_source_model(model))
    dim = _probe(source, neutral_images, "target neutral images")
    if translator is not None and translator.inner.in_features != dim:
        raise InvalidInputError(f"the translator reads {translator.inner.in_features}-d features; the model's F gives {dim}")
    received = torch.zeros(neutral_images.shape[0], dtype=torch.int64) if labels is None else labels
    if observer is not None:
        observer(neutral_images, received)
    feats = features(source, neutral_images)
    with torch.no_grad():
        logits = source.head(feats)
    torch.manual_seed(config.seed)
    t = copy.deepcopy(translator) if translator is not None else FeatureTranslator(dim, config.hidden)
    t.train()
    g = torch.Generator().manual_seed(config.seed + 1)
    target = torch.full((feats.shape[0],), NEUTRAL, dtype=torch.int64)

    def loss_at(step: int) -> torch.Tensor:
        idx = torch.randperm(feats.shape[0], generator=g)[:config.batch_size]
        f = feats[idx]
        tf = t(f)
        out = source.head(tf)
        return (F.cross_entropy(out, target[idx]) + config.lambda_expr * emotion_loss(logits[idx], out, config.emotion)
                + config.lambda_style * _style(config.style, tf, f))

    result = fit(t, loss_at, config.steps, torch.optim.Adam(t.parameters(), lr=config.lr))
    return PftResult(TranslatedModel(source, t.eval()), result.losses)


__all__ = ["check_images", "check_neutral_labels", "features", "pretrain_translator", "PftResult", "personalise", "Observer"]
