"""The arms: each adapts a copy of the source model to one person from that person's neutral frames only.

- source: the source model unchanged.
- adabn: BN statistics of F and B re-estimated on the neutral frames (cumulative average), nothing trained.
- shot-im: SHOT's information-maximisation loss (mean per-frame entropy minus the entropy of the mean prediction),
  F and B trained, C frozen (SHOT's hypothesis transfer), BN in train mode.
- nrc: NRC's neighbourhood consistency (each frame's prediction pulled toward its k = 3 nearest neighbours' in a
  memory bank of B features, plus NRC's diversity term KL(mean prediction || uniform)); F and B trained, C frozen.
  Simplified: no expanded (second-order) neighbours and no self-regularisation term.
- finetune: cross-entropy to the neutral label, F and B trained, C frozen.
- pft / pft-no-stage1: `rankwise.apps.vision.pft.personalise` from the stage-1 translator / from T = identity.
All training arms take the same number of Adam steps on mini-batches of the same neutral frames; the learning rate
is each arm's tuned parameter.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.apps.vision.pft import FeatureTranslator, PftConfig, SourceModel, personalise
from rankwise.core.entropy_losses import information_maximization
from rankwise.core.training import fit

ARMS = ("source", "adabn", "shot-im", "nrc", "finetune", "pft", "pft-no-stage1")
LABELS = {"source": "source only", "adabn": "AdaBN", "shot-im": "SHOT-IM", "nrc": "NRC", "finetune": "neutral fine-tuning",
          "pft": "PFT", "pft-no-stage1": "PFT without stage 1"}
TUNED = ("shot-im", "nrc", "finetune", "pft", "pft-no-stage1")


def adabn(model: SourceModel, neutral: torch.Tensor) -> SourceModel:
    out = copy.deepcopy(model)
    for m in out.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None  # a cumulative average over the frames
    out.train()
    with torch.no_grad():
        out(neutral)
    return out.eval()


def _train_fb(model: SourceModel, neutral: torch.Tensor, lr: float, steps: int, batch: int, seed: int, loss_of) -> SourceModel:
    out = copy.deepcopy(model)
    for p in out.classifier.parameters():
        p.requires_grad_(False)
    g = torch.Generator().manual_seed(seed)
    out.train()
    out.classifier.eval()

    def loss_at(step: int) -> torch.Tensor:
        idx = torch.randperm(neutral.shape[0], generator=g)[:batch]
        return loss_of(out, neutral[idx], idx)

    fit([p for p in out.parameters() if p.requires_grad], loss_at, steps,
        torch.optim.Adam([p for p in out.parameters() if p.requires_grad], lr=lr), on_nonfinite="stop")
    return out.eval()


def shot_im(model, neutral, lr, steps, batch, seed):
    def loss(m, x, idx):
        return information_maximization(m(x))
    return _train_fb(model, neutral, lr, steps, batch, seed, loss)


def nrc(model, neutral, lr, steps, batch, seed, k: int = 3):
    with torch.no_grad():
        model.eval()
        z0 = model.bottleneck(model.features(neutral))
        bank_f, bank_p = F.normalize(z0, dim=1), F.softmax(model.classifier(z0), 1)

    def loss(m, x, idx):
        z = m.bottleneck(m.features(x))
        p = F.softmax(m.classifier(z), 1)
        zn = F.normalize(z, dim=1)
        with torch.no_grad():
            bank_f[idx], bank_p[idx] = zn.detach(), p.detach()
            sim = zn @ bank_f.T
            sim[torch.arange(len(idx)), idx] = -math.inf  # not its own neighbour
            nn_idx = sim.topk(min(k, bank_f.shape[0] - 1), dim=1).indices
        consistency = -(p[:, None, :] * bank_p[nn_idx]).sum(-1).mean()
        mean = p.mean(0)
        return consistency + (mean * torch.log(mean * mean.numel() + 1e-6)).sum()
    return _train_fb(model, neutral, lr, steps, batch, seed, loss)


def finetune(model, neutral, lr, steps, batch, seed):
    def loss(m, x, idx):
        return F.cross_entropy(m(x), torch.zeros(x.shape[0], dtype=torch.int64))
    return _train_fb(model, neutral, lr, steps, batch, seed, loss)


def adapt(arm: str, model: SourceModel, neutral: torch.Tensor, lr: float, steps: int, batch: int, seed: int,
          translator: FeatureTranslator | None, observer=None) -> nn.Module:
    """One arm adapted to one person (neutral frames [n, 1, 48, 48]); returns images -> logits."""
    if arm == "source":
        return model
    if arm == "adabn":
        return adabn(model, neutral)
    if arm in ("pft", "pft-no-stage1"):
        cfg = PftConfig(lr=lr, steps=steps, batch_size=batch, seed=seed, image_shape=tuple(neutral.shape[1:]))
        return personalise(model, neutral, cfg, translator=translator if arm == "pft" else None, observer=observer).model
    fn = {"shot-im": shot_im, "nrc": nrc, "finetune": finetune}[arm]
    return fn(model, neutral, lr, steps, batch, seed)
