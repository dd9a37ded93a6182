"""PFT: personalised feature translation for source-free expression recognition from neutral-only target data
(card pft-fer.md; Sharafi et al., ICLR 2026).

    from rankwise.apps.vision.pft import PftConfig, personalise, pretrain_translator, expression_metrics
    t = pretrain_translator(model, src_images, src_labels, src_subjects, PftConfig())   # stage 1 (source subjects)
    result = personalise(model, neutral_target_images, PftConfig(), translator=t)         # stage 2 (neutral only)
    expression_metrics(result.model, test_images, test_labels)      # accuracy, macro_f1, expressive_recall (points)

One file each: `model` (F -> B -> C and the translator T), `losses` (L_expr, Gram / style / moment), `pairs`
(cosine-matched cross-subject pairs), `config`, `adapt` (the two stages and the input checks), `metrics`.
"""

from rankwise.apps.vision.pft.adapt import (Observer, PftResult, check_images, check_neutral_labels, features, personalise,
                                            pretrain_translator)
from rankwise.apps.vision.pft.config import STYLES, PftConfig
from rankwise.apps.vision.pft.losses import EMOTION_LOSSES, emotion_loss, gram_loss, gram_matrix, moment_loss, style_loss
from rankwise.apps.vision.pft.metrics import expression_metrics, scores
from rankwise.apps.vision.pft.model import FeatureTranslator, SourceModel, TranslatedModel, as_source_model, frozen_copy
from rankwise.apps.vision.pft.pairs import cosine_partners

__all__ = ["Observer", "PftResult", "check_images", "check_neutral_labels", "features", "personalise", "pretrain_translator",
           "STYLES", "PftConfig", "EMOTION_LOSSES", "emotion_loss", "gram_loss", "gram_matrix", "moment_loss", "style_loss",
           "expression_metrics", "scores", "FeatureTranslator", "SourceModel", "TranslatedModel", "as_source_model",
           "frozen_copy", "cosine_partners"]
