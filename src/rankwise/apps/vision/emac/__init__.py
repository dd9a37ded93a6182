"""EMAC (Exposing Mixture and Annotating Confusion) for active universal test-time adaptation (card emac-autta.md).

    from rankwise.apps.vision.emac import EmacConfig, adapt_stream
    result = adapt_stream(model, images, oracle, EmacConfig(budget=0.03))     # a copy of `model` adapts online
    result.scores["h_score"], result.region_errors, result.model

The pieces, one file each: `energy` (the SVD split of the classifier, unknown energy), `mixture` (the windowed,
EMA-smoothed 2-component GMM and the old / mix / new partition), `selection` (the budget schedule, the max-min
entropy rewards, EMAC's rule and the baseline selectors), `losses` (MME and the clustering-contrastive loss),
`stream` (one online pass), `metrics` (the H-score).
"""

from rankwise.apps.vision.emac.config import LOSSES, PARAMS, SELECTORS, EmacConfig
from rankwise.apps.vision.emac.energy import EnergySplit, FeatureTap, find_classifier, split_classifier
from rankwise.apps.vision.emac.losses import UNKNOWN, clustering_contrastive_loss, entropy, mme_loss, prototypes
from rankwise.apps.vision.emac.metrics import open_set_scores
from rankwise.apps.vision.emac.mixture import MIX, NEW, OLD, REGIONS, EnergyMixture, MixtureParams, fit_mixture, partition
from rankwise.apps.vision.emac.selection import (BudgetSchedule, RewardTracker, select_badge, select_coreset, select_emac,
                                                 select_entropy, select_random, select_simatta)
from rankwise.apps.vision.emac.stream import StreamResult, adapt_stream, check_stream

__all__ = ["EmacConfig", "LOSSES", "PARAMS", "SELECTORS", "EnergySplit", "FeatureTap", "find_classifier",
           "split_classifier", "UNKNOWN", "clustering_contrastive_loss", "entropy", "mme_loss", "prototypes",
           "open_set_scores", "MIX", "NEW", "OLD", "REGIONS", "EnergyMixture", "MixtureParams", "fit_mixture", "partition",
           "BudgetSchedule", "RewardTracker", "select_badge", "select_coreset", "select_emac", "select_entropy",
           "select_random", "select_simatta", "StreamResult", "adapt_stream", "check_stream"]
