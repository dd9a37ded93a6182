"""Training and evaluating a logit-offset module (PALC's calibrator, or a steering vector as its control) on cached
features: the frozen model is never run here, so a step costs the module's own matmuls and one softmax per response
token.

Optimiser as in the authors' code: AdamW (weight decay 0.01), linear warm-up then cosine decay, gradient clipping at
1.0. Everything is seeded from the config: two runs with one config are equal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from rankwise.errors import InvalidInputError
from rankwise.recipes.palc.features import CachedPairs, CachedSequences
from rankwise.recipes.palc.loss import preference_loss, sequence_logprobs, token_logprobs


@dataclass(frozen=True)
class PalcTrainConfig:
    lr: float = 1e-3
    epochs: int = 3
    batch_pairs: int = 8
    weight_decay: float = 0.01
    warmup_fraction: float = 0.1
    clip: float = 1.0
    mean_logprob: bool = True  # the authors' code; False: the paper's summed log-probability
    seed: int = 0

    def __post_init__(self) -> None:
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise InvalidInputError(f"lr must be a positive finite number, got {self.lr!r}")
        if self.epochs < 1 or self.batch_pairs < 1:
            raise InvalidInputError(f"epochs and batch_pairs must be >= 1, got {self.epochs}, {self.batch_pairs}")
        if not 0 <= self.warmup_fraction < 1:
            raise InvalidInputError(f"warmup_fraction must be in [0, 1), got {self.warmup_fraction!r}")


def _schedule(step: int, total: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def _pair_logprobs(module: nn.Module | None, seqs: CachedSequences, pair_ids: torch.Tensor, scale: float,
                   mean: bool) -> tuple[torch.Tensor, torch.Tensor]:
    sequences = torch.stack([2 * pair_ids, 2 * pair_ids + 1], dim=1).flatten()  # chosen, rejected, chosen, ...
    rows, segment = seqs.rows(sequences)
    offsets = None if module is None or scale == 0 else module(seqs.hidden[rows])
    per_token = token_logprobs(seqs.base_logits[rows], offsets, seqs.labels[rows], scale)
    ell = sequence_logprobs(per_token, segment, len(sequences), mean).view(-1, 2)
    return ell[:, 0], ell[:, 1]


def train_offsets(module: nn.Module, pairs: CachedPairs, config: PalcTrainConfig = PalcTrainConfig()) -> list[float]:
    """Train `module` (hidden [n, H] -> offsets [n, V]) with PALC's loss at scale 1. Returns the loss per step."""
    if len(pairs) == 0:
        raise InvalidInputError("no preference pairs to train on")
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise InvalidInputError("the module has no trainable parameters")
    generator = torch.Generator().manual_seed(config.seed)
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    steps_per_epoch = math.ceil(len(pairs) / config.batch_pairs)
    total = steps_per_epoch * config.epochs
    warmup = max(1, int(config.warmup_fraction * total))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _schedule(s, total, warmup))
    losses = []
    module.train()
    dropout_seed = torch.randint(0, 2**62, (1,), generator=generator).item()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(dropout_seed)  # the module's dropout draws from torch's global generator
        for _ in range(config.epochs):
            order = torch.randperm(len(pairs), generator=generator)
            for b in range(steps_per_epoch):
                batch = order[b * config.batch_pairs:(b + 1) * config.batch_pairs]
                chosen, rejected = _pair_logprobs(module, pairs.sequences, batch, 1.0, config.mean_logprob)
                loss = preference_loss(chosen, rejected)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, config.clip)
                optimizer.step()
                scheduler.step()
                losses.append(float(loss.detach()))
    module.eval()
    return losses


@torch.no_grad()
def pair_margins(module: nn.Module | None, pairs: CachedPairs, scale: float = 1.0, mean: bool = True,
                 batch_pairs: int = 64) -> torch.Tensor:
    """l(chosen) - l(rejected) per pair [P] under base + scale * module (module None or scale 0: the base)."""
    if module is not None:
        module.eval()
    margins = []
    for b in range(0, len(pairs), batch_pairs):
        ids = torch.arange(b, min(b + batch_pairs, len(pairs)))
        chosen, rejected = _pair_logprobs(module, pairs.sequences, ids, scale, mean)
        margins.append(chosen - rejected)
    return torch.cat(margins)


def preference_accuracy(module: nn.Module | None, pairs: CachedPairs, scale: float = 1.0, mean: bool = True) -> float:
    """P[l(y_w) > l(y_l)] on held-out pairs (ties count as half)."""
    m = pair_margins(module, pairs, scale, mean)
    return float(((m > 0).double() + 0.5 * (m == 0).double()).mean())


@torch.no_grad()
def drift_from_base(module: nn.Module | None, seqs: CachedSequences, scale: float = 1.0,
                    batch_rows: int = 2048) -> dict[str, float]:
    """On cached text (every row a predicted token): mean KL(calibrated || base) per token (nats), and the
    calibrated and base perplexities of the labels."""
    if module is not None:
        module.eval()
    kl_sum, nll_sum, base_nll_sum, n = 0.0, 0.0, 0.0, 0
    for b in range(0, seqs.hidden.shape[0], batch_rows):
        rows = slice(b, b + batch_rows)
        base = torch.log_softmax(seqs.base_logits[rows].float(), dim=1)
        logits = seqs.base_logits[rows].float()
        if module is not None and scale != 0:
            logits = logits + scale * module(seqs.hidden[rows])
        cal = torch.log_softmax(logits, dim=1)
        labels = seqs.labels[rows][:, None]
        kl_sum += float((cal.exp() * (cal - base)).sum())
        nll_sum -= float(cal.gather(1, labels).sum())
        base_nll_sum -= float(base.gather(1, labels).sum())
        n += labels.shape[0]
    if n == 0:
        raise InvalidInputError("no cached rows to measure drift on")
    return {"kl": kl_sum / n, "ppl": math.exp(nll_sum / n), "base_ppl": math.exp(base_nll_sum / n)}


def caa_vector(pairs: CachedPairs) -> torch.Tensor:
    """Contrastive activation addition: mean last hidden state over the chosen responses' positions minus the mean
    over the rejected ones' [H] (scaled by a tuned alpha when used)."""
    seqs = pairs.sequences
    ids = torch.arange(len(pairs))
    chosen_rows, _ = seqs.rows(2 * ids)
    rejected_rows, _ = seqs.rows(2 * ids + 1)
    return seqs.hidden[chosen_rows].mean(0) - seqs.hidden[rejected_rows].mean(0)
