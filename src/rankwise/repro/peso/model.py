"""The recommender: a small causal Llama over item-ID tokens (a SASRec-style next-item model on the Llama
architecture), its training task for the one training loop, and ranking metrics (Hit@K, NDCG@K)."""

from __future__ import annotations

import math

import torch
from torch import nn

from rankwise.models import tiny_llama
from rankwise.repro.peso.data import IGNORE, PAD, Sequences, Windows, seen_before


def item_llama(vocab_size: int, seed: int, hidden: int, layers: int) -> nn.Module:
    """Llama with tied item embeddings: hidden width `hidden`, 4 query / 2 KV heads, MLP 2x wide."""
    return tiny_llama(seed=seed, vocab_size=vocab_size, hidden_size=hidden, num_layers=layers, num_heads=4, num_kv_heads=2,
                      intermediate_size=2 * hidden, tie_word_embeddings=True)


class NextItemTask:
    """Next-item cross-entropy on the targets of one block's windows (the loop's `Task`)."""

    metric = "loss"
    higher_is_better = False

    def __init__(self, windows: Windows, name: str) -> None:
        self.windows, self.name = windows, name

    @property
    def num_train(self) -> int:
        return self.windows.tokens.size(0)

    def batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"input_ids": self.windows.tokens[indices], "labels": self.windows.labels[indices]}

    def batch_tokens(self, batch: dict[str, torch.Tensor]) -> int:
        return int((batch["labels"] != IGNORE).sum())

    def loss(self, module: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        ids = batch["input_ids"]
        return module(input_ids=ids, attention_mask=(ids != PAD).long(), labels=batch["labels"]).loss

    def evaluate(self, module: nn.Module) -> dict[str, float]:
        return {}  # the experiment evaluates on the next block itself


@torch.no_grad()
def target_ranks(module: nn.Module, windows: Windows, seqs: Sequences, batch_size: int = 128) -> torch.Tensor:
    """rank [n_targets] (1 = best) of each target item among all items the user has not rated before."""
    module.eval()
    ranks = []
    for start in range(0, windows.tokens.size(0), batch_size):
        ids = windows.tokens[start : start + batch_size]
        labels = windows.labels[start : start + batch_size]
        out = module(input_ids=ids, attention_mask=(ids != PAD).long())
        # logits at position j predict token j+1: the target at column c is scored by position c-1
        rows, cols = torch.nonzero(labels != IGNORE, as_tuple=True)
        logits = out.logits[rows, cols - 1].float()
        ranks.append((rows + start, cols, logits, labels[rows, cols]))
    if not ranks:
        return torch.zeros(0, dtype=torch.long)
    logits = torch.cat([r[2] for r in ranks])
    target = torch.cat([r[3] for r in ranks])
    mask = seen_before(seqs, windows.target_user, windows.target_position)
    mask[torch.arange(target.numel()), target] = False  # never mask the target itself
    logits = logits.masked_fill(mask, -math.inf)
    score = logits.gather(1, target[:, None])
    return (logits > score).sum(1) + 1


def hit_at(ranks: torch.Tensor, k: int = 10) -> float:
    return float((ranks <= k).double().mean()) if ranks.numel() else float("nan")


def ndcg_at(ranks: torch.Tensor, k: int = 10) -> float:
    if not ranks.numel():
        return float("nan")
    gain = torch.where(ranks <= k, 1.0 / torch.log2(ranks.double() + 1), torch.zeros((), dtype=torch.float64))
    return float(gain.mean())

