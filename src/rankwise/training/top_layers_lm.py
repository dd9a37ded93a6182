"""Next-token fine-tuning of the top layers of a causal LM over cached frozen-prefix states, as a harness task.

The hidden states entering the first adaptable layer are computed once per window (`FrozenPrefixRunner.prefix`);
a training step then runs only the top layers, the final norm and the LM head. The head's softmax is taken over the
task's output vocabulary (e.g. the token ids that occur in one topic's text, a few thousand of SmolLM2's 49,152): the
full-vocabulary head would cost more than the adapted layers themselves on a CPU. The loss is then the NLL of the
next token given that it is one of the task's tokens, the same restriction for every arm of an experiment.

    task = TopLayersLM(runner, vocab, model.lm_head.weight)           # vocab [V]: sorted token ids
    index = TopLayersLM.token_index(vocab, model.lm_head.weight.size(0))
    task.train_set, task.eval_set = CachedWindows(runner, train, index), CachedWindows(runner, validation, index)
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.errors import InvalidInputError
from rankwise.training.frozen_prefix import FrozenPrefixRunner


class CachedWindows:
    """Prefix states [W, T-1, D] of windows [W, T] and their next-token targets [W, T-1] in vocabulary indices."""

    def __init__(self, runner: FrozenPrefixRunner, windows: torch.Tensor, token_index: torch.Tensor, batch_size: int = 16) -> None:
        if windows.dim() != 2 or windows.size(1) < 2:
            raise InvalidInputError(f"windows must be [W, T] with T >= 2, got {tuple(windows.shape)}")
        targets = token_index[windows[:, 1:]]
        if bool((targets < 0).any()):
            raise InvalidInputError("a target token is outside the task vocabulary")
        self.h = torch.stack(runner.prefix(list(windows[:, :-1]), batch_size=batch_size))
        self.targets = targets

    def __len__(self) -> int:
        return self.h.size(0)


class TopLayersLM:
    """The harness task: loss = mean next-token NLL over the vocabulary `vocab` [V] (sorted token ids)."""

    name = "topic-lm"
    metric = "eval_loss"
    higher_is_better = False

    def __init__(self, runner: FrozenPrefixRunner, vocab: torch.Tensor, head_weight: torch.Tensor) -> None:
        self.runner = runner
        # The head restricted to the vocabulary, frozen: [V, D].
        self.head = head_weight.detach()[vocab].clone()
        self.train_set: CachedWindows | None = None
        self.eval_set: CachedWindows | None = None

    @staticmethod
    def token_index(vocab: torch.Tensor, size: int) -> torch.Tensor:
        """Lookup table [size]: token id -> its index in `vocab`, -1 for ids outside it."""
        table = torch.full((size,), -1, dtype=torch.long)
        table[vocab] = torch.arange(vocab.numel())
        return table

    @property
    def num_train(self) -> int:
        return len(self.train_set)

    def batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"h": self.train_set.h[indices], "targets": self.train_set.targets[indices]}

    def batch_tokens(self, batch: dict[str, torch.Tensor]) -> int:
        return batch["targets"].numel()

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Logits over the vocabulary [B, T, V] from prefix states [B, T, D]."""
        return self.runner.top(h) @ self.head.T

    def loss(self, module: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(self.logits(batch["h"]).flatten(0, 1), batch["targets"].flatten())

    @torch.no_grad()
    def nll(self, data: CachedWindows, batch_size: int = 32) -> float:
        """Mean next-token NLL (nats per token) over every target of `data`."""
        total = 0.0
        for i in range(0, len(data), batch_size):
            logits = self.logits(data.h[i : i + batch_size])
            total += float(F.cross_entropy(logits.flatten(0, 1), data.targets[i : i + batch_size].flatten(), reduction="sum"))
        return total / data.targets.numel()

    def evaluate(self, module: nn.Module) -> dict[str, float]:
        was = module.training
        module.eval()
        try:
            return {"eval_loss": self.nll(self.eval_set)}
        finally:
            module.train(was)
