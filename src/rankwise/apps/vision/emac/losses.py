"""EMAC's adaptation losses: the max-min entropy objective and the clustering-contrastive loss (card step 3).

    L = L_MME + L_c (+ cross-entropy on the oracle's known-class labels, the active arms' shared supervised term)
    L_MME = mean_{x in X_old} H(p(x)) - mean_{x in X_new} H(p(x))
    L_c   = mean_{i in I_old} -(1/|Q(i)|) sum_{p in Q(i)} log( exp(s_ip / tau) / sum_{j in Q(i) u N(i)} exp(s_ij / tau) )

with s the cosine similarity, Q(i) the other anchors of i's class plus its prototype, N(i) every other sample of
I_old u I_new (new-class samples are only ever negatives), and the prototype of class c the mean of its
high-confidence pseudo-labelled features F_p and annotated features F_a, normalised by 1/(|F_p| + |F_a|) (the
card's reading of the note's garbled 1/(|F_p||F_a|)).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from rankwise.core.entropy_losses import entropy  # noqa: F401 (re-exported: EMAC's losses in one place)
from rankwise.errors import InvalidInputError

UNKNOWN = -1  # the oracle's answer (and the pseudo-label) for a new-class sample


def mme_loss(logits: torch.Tensor, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """Max-min entropy: mean entropy over the `old` rows minus mean entropy over the `new` rows (bool masks [B]);
    an empty set contributes 0."""
    h = entropy(logits)
    zero = logits.sum() * 0.0  # keeps the graph (and the dtype) when both sets are empty
    return (h[old].mean() if old.any() else zero) - (h[new].mean() if new.any() else zero)


def prototypes(features: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(prototypes [C, D], present [C] bool): per class, sum of the features [N, D] labelled c (pseudo-labelled and
    annotated rows together) over their count |F_p| + |F_a|. Labels [N] in 0..C-1 (UNKNOWN rows are skipped)."""
    known = labels >= 0
    z, y = features[known], labels[known]
    sums = torch.zeros(num_classes, features.shape[1], dtype=features.dtype).index_add_(0, y, z)
    counts = torch.bincount(y, minlength=num_classes).to(features.dtype)
    present = counts > 0
    return sums / counts.clamp_min(1.0).unsqueeze(1), present


def clustering_contrastive_loss(features: torch.Tensor, labels: torch.Tensor, num_classes: int, tau: float = 0.1) -> torch.Tensor:
    """L_c (module docstring) of features [N, D] with labels [N] (a known class 0..C-1: an I_old anchor; UNKNOWN: an
    I_new sample). Prototypes are built from the same rows and detached (a target, not a path for the gradient).
    Returns a scalar; 0 (with the graph) when there is no anchor."""
    if features.dim() != 2 or labels.shape != features.shape[:1]:
        raise InvalidInputError(f"features must be [N, D] and labels [N], got {tuple(features.shape)} and {tuple(labels.shape)}")
    if not tau > 0:
        raise InvalidInputError(f"the temperature tau must be positive, got {tau}")
    anchors = (labels >= 0).nonzero().squeeze(1)
    if anchors.numel() == 0:
        return features.sum() * 0.0
    z = F.normalize(features, dim=1)
    protos, _ = prototypes(z.detach(), labels, num_classes)
    protos = F.normalize(protos, dim=1)
    za, ya = z[anchors], labels[anchors]
    sample_sim = za @ z.T / tau  # [A, N]
    proto_sim = (za * protos[ya]).sum(1, keepdim=True) / tau  # [A, 1]: each anchor with its own prototype
    not_self = torch.ones_like(sample_sim, dtype=torch.bool)
    not_self[torch.arange(anchors.numel()), anchors] = False
    positive = (labels.unsqueeze(0) == ya.unsqueeze(1)) & not_self  # same class, other samples
    logits = torch.cat([proto_sim, sample_sim.masked_fill(~not_self, float("-inf"))], dim=1)  # S(i) over Q(i) u N(i)
    log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)
    pos_mask = torch.cat([torch.ones_like(proto_sim, dtype=torch.bool), positive], dim=1)
    per_anchor = -(log_prob.masked_fill(~pos_mask, 0.0).sum(1)) / pos_mask.sum(1)
    return per_anchor.mean()
