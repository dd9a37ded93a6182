"""One online pass of (active) universal test-time adaptation over a stream: a model and a stream in, the adapted
model, its online predictions and the metrics out.

    result = adapt_stream(model, images, oracle, EmacConfig(budget=0.03))
    result.scores["h_score"], result.region_errors["mix"], result.annotations, result.model

Per batch (in stream order, `config.batch_size` images): one forward (the batch, with the replayed labelled store
appended) gives logits and the classifier's input features; their unknown energies update the mixture and split
the batch into X_old / X_mix / X_new; the online prediction is the argmax over the C known classes, or UNKNOWN where
the new component's responsibility exceeds 0.5 (the same rule for every arm, so arms differ in how they adapt and
what they label, not in how they reject); the selector spends the batch's share of the budget on the oracle
(`oracle[i]`: the class, or UNKNOWN); then one gradient step (`core.training.fit`, Adam) on the arm's loss, and,
for EMAC's selector, a no-grad forward after the step to measure the rewards. Batch norm uses batch statistics in
every adapting arm (TENT's setting); the source arm runs in eval mode and never updates.

The online loop is `fit` with a loss that is a function of the step (the stream's batch t), not `train`: TTA has no
epochs, schedule or held-out evaluation.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.apps.vision.emac.config import EmacConfig
from rankwise.apps.vision.emac.energy import EnergySplit, FeatureTap, find_classifier, split_classifier
from rankwise.apps.vision.emac.losses import UNKNOWN, clustering_contrastive_loss, mme_loss
from rankwise.core.entropy_losses import entropy, information_maximization
from rankwise.apps.vision.emac.metrics import open_set_scores
from rankwise.apps.vision.emac.mixture import MIX, NEW, OLD, REGIONS, EnergyMixture, partition
from rankwise.apps.vision.emac.selection import (BudgetSchedule, RewardTracker, select_badge, select_coreset,
                                                 select_emac, select_entropy, select_random, select_simatta)
from rankwise.core.training.fitting import fit
from rankwise.errors import InvalidInputError


@dataclass
class StreamResult:
    """What one pass returns: the adapted model, per-sample online predictions [N] (class or UNKNOWN), regions [N]
    (OLD / MIX / NEW), which samples were annotated [N] bool, the scores, and the per-region pseudo-label error."""

    model: nn.Module
    predictions: torch.Tensor
    regions: torch.Tensor
    annotated: torch.Tensor
    scores: dict[str, float]
    region_errors: dict[str, float]  # points; NaN for an empty region
    region_sizes: dict[str, int]
    budget: int
    annotations: int
    mixture_fallbacks: int
    diverged: str | None = None
    rewards: list[tuple[float, float]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"scores": self.scores, "region_errors": self.region_errors, "region_sizes": self.region_sizes,
                "budget": self.budget, "annotations": self.annotations, "mixture_fallbacks": self.mixture_fallbacks,
                "diverged": self.diverged}


def check_stream(model: nn.Module, images: torch.Tensor, oracle: torch.Tensor, config: EmacConfig) -> tuple[nn.Linear, EnergySplit]:
    """Everything refused before any work: the config, the stream's shape and range, the labels, the classifier."""
    config.validate()
    if not isinstance(images, torch.Tensor) or images.dim() != 4 or not images.is_floating_point():
        raise InvalidInputError(f"the stream must be float images [N, C, H, W], got "
                                f"{getattr(images, 'dtype', type(images).__name__)} {tuple(getattr(images, 'shape', ()))}")
    if images.shape[0] == 0:
        raise InvalidInputError("the stream is empty: pass at least one batch of images")
    if not torch.isfinite(images).all() or float(images.min()) < 0.0 or float(images.max()) > 1.0:
        raise InvalidInputError("stream pixel values must be finite and lie in [0, 1]")
    classifier = find_classifier(model)
    split = split_classifier(classifier.weight)
    c = classifier.out_features
    if oracle.dtype != torch.int64 or oracle.shape != images.shape[:1]:
        raise InvalidInputError(f"oracle labels must be int64 [{images.shape[0]}] (a class, or {UNKNOWN} for a new class), "
                                f"got {oracle.dtype} {tuple(oracle.shape)}")
    if oracle.numel() and (int(oracle.min()) < UNKNOWN or int(oracle.max()) >= c):
        raise InvalidInputError(f"oracle labels must lie in {UNKNOWN}..{c - 1} ({UNKNOWN}: unknown), got "
                                f"{int(oracle.min())}..{int(oracle.max())}")
    if config.loss != "none" and config.params == "bn" and not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        raise InvalidInputError("params='bn' adapts batch-norm affine parameters, but the model has no batch norm: "
                                "use params='features' or 'all'")
    return classifier, split


def _adapted_parameters(model: nn.Module, classifier: nn.Linear, params: str) -> list[nn.Parameter]:
    model.requires_grad_(False)
    if params == "bn":
        chosen = [p for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) for p in m.parameters()]
    elif params == "features":
        head = {id(p) for p in classifier.parameters()}
        chosen = [p for p in model.parameters() if id(p) not in head]
    else:
        chosen = list(model.parameters())
    for p in chosen:
        p.requires_grad_(True)
    return chosen


def adapt_stream(model: nn.Module, images: torch.Tensor, oracle: torch.Tensor, config: EmacConfig | None = None) -> StreamResult:
    """Adapt a copy of `model` (logits [B, C] from images [B, C_in, H, W]; a final nn.Linear classifier reading
    features [B, D], D > C) online over `images` [N, C_in, H, W] in [0, 1], with `oracle` [N] (class 0..C-1 or
    UNKNOWN) answering only for the samples the selector labels. The model passed in is not changed."""
    config = config or EmacConfig()
    check_stream(model, images, oracle, config)
    model = copy.deepcopy(model)
    classifier = find_classifier(model)
    split = split_classifier(classifier.weight)  # the source classifier's split, fixed for the whole stream
    run = _Stream(model, classifier, split, images, oracle, config)
    run.go()
    return run.result()


class _Stream:
    """The state of one pass (module docstring)."""

    def __init__(self, model: nn.Module, classifier: nn.Linear, split: EnergySplit, images: torch.Tensor,
                 oracle: torch.Tensor, config: EmacConfig) -> None:
        self.model, self.classifier, self.split, self.images, self.oracle, self.config = model, classifier, split, images.float(), oracle, config
        self.num_classes = classifier.out_features
        n = images.shape[0]
        self.starts = list(range(0, n, config.batch_size))
        self.schedule = BudgetSchedule(round(config.budget * n) if config.active else 0, len(self.starts))
        self.mixture = EnergyMixture(window=config.window, ema=config.ema, seed=config.seed)
        self.rewards = RewardTracker(alpha=config.reward_alpha)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.predictions = torch.full((n,), UNKNOWN, dtype=torch.int64)
        self.regions = torch.full((n,), MIX, dtype=torch.int64)
        self.pseudo = torch.full((n,), UNKNOWN, dtype=torch.int64)
        self.annotated = torch.zeros(n, dtype=torch.bool)
        self.store: list[int] = []  # stream indices of annotated samples, most recent last
        self.tap = FeatureTap(classifier)
        self.diverged: str | None = None
        self._pending: dict | None = None

    # -- the pass ---------------------------------------------------------------------------------------------
    def go(self) -> None:
        c = self.config
        try:
            if c.loss == "none":
                self.model.eval()
                with torch.no_grad():
                    for t in range(len(self.starts)):
                        self._observe(t)
                return
            trained = _adapted_parameters(self.model, self.classifier, c.params)
            self.model.train()  # batch statistics in every adapting arm
            done = fit(trained, self._loss_at, len(self.starts), lambda ps: torch.optim.Adam(ps, lr=c.lr),
                       after_step=self._after_step if c.selector == "emac" and c.active else None, on_nonfinite="stop")
            if done.diverged is not None:  # a diverged arm is a result: the rest of the stream is predicted unadapted
                self.diverged = done.diverged
                with torch.no_grad():
                    for t in range(done.steps + 1, len(self.starts)):
                        self._observe(t)
        finally:
            self.tap.remove()
            self.model.requires_grad_(False)
            self.model.eval()

    def _batch(self, t: int) -> torch.Tensor:
        s = self.starts[t]
        return torch.arange(s, min(s + self.config.batch_size, self.images.shape[0]))

    def _observe(self, t: int) -> dict:
        """Forward batch t (and the replayed store), partition, predict, select; returns what the loss needs."""
        idx = self._batch(t)
        replay = torch.tensor(self.store[-self.config.store_size:] if self.config.store_size else [], dtype=torch.int64)
        logits_all = self.model(self.images[torch.cat([idx, replay])])
        feats_all = self.tap.features
        b = idx.numel()
        logits, feats = logits_all[:b], feats_all[:b]
        e = self.split.unknown_energy(feats)
        params = self.mixture.update(e)
        region = partition(e, params)
        p_new = params.posterior_new(e)
        with torch.no_grad():
            probs = logits.softmax(1)
            h = entropy(logits)
        pred = torch.where(p_new > 0.5, torch.full_like(idx, UNKNOWN), probs.argmax(1))
        self.predictions[idx], self.regions[idx] = pred, region
        # the pseudo-label each region would give: X_old its argmax, X_new UNKNOWN, X_mix by the larger responsibility
        self.pseudo[idx] = torch.where(region == OLD, probs.argmax(1), torch.where(region == NEW, torch.full_like(idx, UNKNOWN), pred))
        chosen = self._select(t, region, probs, h, p_new, feats)
        if chosen.numel():
            self.schedule.spend(int(chosen.numel()))
            self.annotated[idx[chosen]] = True
            self.store.extend(idx[chosen].tolist())
            answers = self.oracle[idx[chosen]]
            self.rewards.annotated_old += int((answers != UNKNOWN).sum())
            self.rewards.annotated_new += int((answers == UNKNOWN).sum())
        return {"idx": idx, "replay": replay, "logits_all": logits_all, "feats_all": feats_all, "region": region,
                "p_new": p_new, "probs": probs, "entropy": h, "chosen": chosen}

    def _select(self, t: int, region, probs, h, p_new, feats) -> torch.Tensor:
        c = self.config
        k = self.schedule.allowance(t) if c.active else 0
        if k == 0:
            return torch.zeros(0, dtype=torch.int64)
        everything = torch.ones_like(region, dtype=torch.bool)
        labelled = self.tap_store_features()
        if c.selector == "emac":
            candidates = region == MIX if c.restrict_to_mix else everything
            return select_emac(candidates, k, h, p_new, self.rewards.prefer_old())
        if c.selector == "random":
            return select_random(everything, k, self.generator)
        if c.selector == "entropy":
            return select_entropy(everything, k, h)
        if c.selector == "coreset":
            return select_coreset(everything, k, feats, labelled)
        if c.selector == "badge":
            return select_badge(everything, k, feats, probs, self.generator)
        return select_simatta(everything, k, feats, h, labelled)

    def tap_store_features(self) -> torch.Tensor:
        """Features of the replayed store from this step's forward ([M, D]; empty before any label)."""
        feats = self.tap.features
        n_replay = min(len(self.store), self.config.store_size)
        if feats is None or n_replay == 0:
            return torch.zeros(0, 1)
        return feats[feats.shape[0] - n_replay:].detach()

    # -- the losses -------------------------------------------------------------------------------------------
    def _loss_at(self, t: int) -> torch.Tensor:
        o = self._observe(t)
        self._pending = o
        c = self.config
        b = o["idx"].numel()
        logits = o["logits_all"][:b]
        # labelled rows: this batch's new annotations and the replayed store (rows b.. of the forward)
        lab_rows = torch.cat([o["chosen"], torch.arange(b, b + o["replay"].numel())])
        lab_y = self.oracle[torch.cat([o["idx"][o["chosen"]], o["replay"]])]
        if c.loss == "tent":
            return entropy(logits).mean()
        if c.loss == "shot-im":
            return information_maximization(logits)
        if c.loss == "open-tent":
            new = o["p_new"] > 0.5
            return mme_loss(logits, ~new, new)
        all_logits = o["logits_all"]
        known_lab = lab_rows[lab_y != UNKNOWN]
        unknown_lab = lab_rows[lab_y == UNKNOWN]
        ce = F.cross_entropy(all_logits[known_lab], lab_y[lab_y != UNKNOWN]) if known_lab.numel() else all_logits.sum() * 0.0
        rows = all_logits.shape[0]
        unlabelled = torch.ones(rows, dtype=torch.bool)
        unlabelled[lab_rows] = False
        batch_rows = torch.zeros(rows, dtype=torch.bool)
        batch_rows[:b] = True
        if c.loss == "simatta":
            # SimATTA-like: labels (cross-entropy) + entropy minimisation on the confident half; annotated new-class
            # samples pushed to high entropy (its closed-set loss has no other use for them)
            h = entropy(logits)
            confident = torch.zeros(rows, dtype=torch.bool)
            confident[:b] = (h <= h.median()) & (o["p_new"] <= 0.5)
            confident &= unlabelled
            new_lab = torch.zeros(rows, dtype=torch.bool)
            new_lab[unknown_lab] = True
            return ce + mme_loss(all_logits, confident, new_lab)
        # EMAC's loss: MME on X_old / X_new (+ annotated new-class samples), L_c over the anchors, CE on the labels
        region = torch.full((rows,), MIX, dtype=torch.int64)
        region[:b] = o["region"]
        old = batch_rows & unlabelled & (region == OLD)
        new = batch_rows & unlabelled & (region == NEW)
        new[unknown_lab] = True
        labels = torch.full((rows,), -2, dtype=torch.int64)  # -2: not part of L_c
        probs_all = all_logits.detach().softmax(1)
        confident_old = old & (probs_all.max(1).values >= c.confidence)
        labels[confident_old] = probs_all.argmax(1)[confident_old]  # F_p
        labels[new] = UNKNOWN  # I_new: negatives only
        labels[lab_rows] = lab_y  # F_a (and annotated new-class samples)
        keep = labels >= UNKNOWN
        lc = clustering_contrastive_loss(o["feats_all"][keep], labels[keep], self.num_classes, c.tau) if keep.any() else ce * 0.0
        return mme_loss(all_logits, old, new) + c.contrastive_weight * lc + ce

    def _after_step(self, t: int) -> None:
        """EMAC's rewards: entropies of this batch's X_old and X_new before and after the update."""
        o = self._pending
        idx, region, h_before = o["idx"], o["region"], o["entropy"]
        old, new = region == OLD, region == NEW
        if not (old.any() and new.any()):
            return
        norms = [m for m in self.model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        momenta = [m.momentum for m in norms]
        try:  # a measurement, not a step: batch statistics as in the prediction, running statistics left as they are
            for m in norms:
                m.momentum = 0.0
            with torch.no_grad():
                h_after = entropy(self.model(self.images[idx]))
        finally:
            for m, momentum in zip(norms, momenta):
                m.momentum = momentum
        g_old, g_new = RewardTracker.gammas(float(h_before[old].mean()), float(h_after[old].mean()),
                                            float(h_before[new].mean()), float(h_after[new].mean()))
        self.rewards.update(g_old, g_new)

    # -- the result -------------------------------------------------------------------------------------------
    def result(self) -> StreamResult:
        errors, sizes = {}, {}
        for r, name in enumerate(REGIONS):
            mask = self.regions == r
            sizes[name] = int(mask.sum())
            errors[name] = 100.0 * float((self.pseudo[mask] != self.oracle[mask]).double().mean()) if mask.any() else float("nan")
        return StreamResult(self.model, self.predictions, self.regions, self.annotated,
                            open_set_scores(self.predictions, self.oracle), errors, sizes, self.schedule.total,
                            self.schedule.spent, self.mixture.fallbacks, self.diverged, list(self.rewards.history))
