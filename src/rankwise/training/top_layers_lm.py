"""Next-token fine-tuning of the top layers of a causal LM over cached frozen-prefix states, as harness tasks (the
decoder part of the prefix cache, `training.prefix_cache`).

The hidden states entering the first adaptable layer are computed once per sequence (`FrozenPrefixRunner.prefix`);
a training step then runs only the top layers, the final norm and the LM head. Two tasks:

- `TopLayersLM` on fixed-length windows: the head's softmax is taken over the task's output vocabulary (e.g. the
  token ids that occur in one topic's text, a few thousand of SmolLM2's 49,152): the full-vocabulary head would cost
  more than the adapted layers themselves on a CPU. The loss is then the NLL of the next token given that it is one
  of the task's tokens, the same restriction for every arm of an experiment.
- `CachedSequencesLM` on variable-length sequences with per-position targets (`IGNORE_INDEX` where no loss, e.g. a
  prompt), right-padded per batch; the full vocabulary, the LM head applied only at the target positions.

    task = TopLayersLM(runner, vocab, model.lm_head.weight)           # vocab [V]: sorted token ids
    index = TopLayersLM.token_index(vocab, model.lm_head.weight.size(0))
    task.train_set, task.eval_set = CachedWindows(runner, train, index), CachedWindows(runner, validation, index)

    task = CachedSequencesLM(runner, runner.prefix(ids), targets)     # ids, targets: [T_i] each
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.errors import InvalidInputError
from rankwise.training.frozen_prefix import IGNORE_INDEX, FrozenPrefixRunner
from rankwise.training.prefix_cache import CachedExamples, CachedTask, Ragged, eval_mode


class CachedWindows(CachedExamples):
    """Prefix states h [W, T-1, D] of windows [W, T] and their next-token targets [W, T-1] in vocabulary indices."""

    def __init__(self, runner: FrozenPrefixRunner, windows: torch.Tensor, token_index: torch.Tensor, batch_size: int = 16) -> None:
        if windows.dim() != 2 or windows.size(1) < 2:
            raise InvalidInputError(f"windows must be [W, T] with T >= 2, got {tuple(windows.shape)}")
        targets = token_index[windows[:, 1:]]
        if bool((targets < 0).any()):
            raise InvalidInputError("a target token is outside the task vocabulary")
        super().__init__(h=torch.stack(runner.prefix(list(windows[:, :-1]), batch_size=batch_size)), targets=targets)


class TopLayersLM(CachedTask):
    """The harness task: loss = mean next-token NLL over the vocabulary `vocab` [V] (sorted token ids)."""

    name = "topic-lm"
    metric = "eval_loss"
    higher_is_better = False

    def __init__(self, runner: FrozenPrefixRunner, vocab: torch.Tensor, head_weight: torch.Tensor) -> None:
        super().__init__(None)  # train_set (a CachedWindows) and eval_set are set by the experiment
        self.runner = runner
        # The head restricted to the vocabulary, frozen: [V, D].
        self.head = head_weight.detach()[vocab].clone()
        self.eval_set: CachedWindows | None = None

    @staticmethod
    def token_index(vocab: torch.Tensor, size: int) -> torch.Tensor:
        """Lookup table [size]: token id -> its index in `vocab`, -1 for ids outside it."""
        table = torch.full((size,), -1, dtype=torch.long)
        table[vocab] = torch.arange(vocab.numel())
        return table

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
        for part in data.chunks(batch_size):
            logits = self.logits(part["h"])
            total += float(F.cross_entropy(logits.flatten(0, 1), part["targets"].flatten(), reduction="sum"))
        return total / data.targets.numel()

    def evaluate(self, module: nn.Module) -> dict[str, float]:
        with eval_mode(module):
            return {"eval_loss": self.nll(self.eval_set)}


class CachedSequencesLM(CachedTask):
    """The harness task on variable-length cached sequences: loss = mean next-token cross-entropy over every target
    position of a batch (`FrozenPrefixRunner.loss`, the full vocabulary).

    `hs[i]` [T_i, D]: prefix states of sequence i (`runner.prefix`); `targets[i]` [T_i]: at position t the token t
    must predict, or `IGNORE_INDEX`. The task scores nothing itself (`evaluate` returns {}): an experiment scores its
    models on its own cached sets (e.g. with `runner.per_sequence_logits`).
    """

    name = "cached-sequences-lm"
    metric = "eval_loss"
    higher_is_better = False

    def __init__(self, runner: FrozenPrefixRunner, hs: Sequence[torch.Tensor], targets: Sequence[torch.Tensor]) -> None:
        if len(hs) != len(targets):
            raise InvalidInputError(f"got {len(hs)} prefix states for {len(targets)} target sequences")
        if any(h.size(0) != t.size(0) for h, t in zip(hs, targets)):
            raise InvalidInputError("each sequence needs one target per prefix state (T_i of both)")
        super().__init__(CachedExamples(h=Ragged(list(hs), 0.0), targets=Ragged(list(targets), IGNORE_INDEX)))
        self.runner = runner

    def loss(self, module: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.runner.loss(batch["h"], batch["targets"])

    def evaluate(self, module: nn.Module) -> dict[str, float]:
        return {}
