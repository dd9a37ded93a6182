"""Sequence classification on cached encoder inputs: when only the top layers of a BERT-style encoder (MiniLM) are
adapted, the layers below are a fixed function of the text, so their output is computed once per example
(`cache_encoder_inputs`) and a training step runs only the top layers and the head
(`training.encoder_top.EncoderTopClassifier`). `CachedClassificationTask` is the loop's task over such a cache.

    start = len(model.encoder.layer) - top                      # the first adapted layer
    train = cache_encoder_inputs(model, tokenizer, texts, labels, max_length=16, start=start)
    task = CachedClassificationTask(train, held_out, name="wiki-topics (cached prefix)")
    train(EncoderTopClassifier(model.encoder.layer[start:], hidden, num_labels), task, config)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class CachedInputs:
    """The first adapted layer's input h [N, T, D], its attention mask [N, T] (1.0 = token) and the labels [N]."""

    h: torch.Tensor
    mask: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return self.h.size(0)


@torch.no_grad()
def cache_encoder_inputs(model: nn.Module, tokenizer, texts: list[str], labels: list[int], max_length: int, start: int,
                         batch_size: int = 64) -> CachedInputs:
    """The output of the encoder's layers below `start` (the input of layer `start`) for each text, every text padded
    to `max_length` tokens (so one mask shape serves all batches). `model`: a transformers encoder (MiniLM)."""
    enc = tokenizer(texts, truncation=True, max_length=max_length, padding="max_length", return_tensors="pt")
    hs = [model(input_ids=enc["input_ids"][i : i + batch_size], attention_mask=enc["attention_mask"][i : i + batch_size],
                output_hidden_states=True).hidden_states[start] for i in range(0, len(texts), batch_size)]
    return CachedInputs(torch.cat(hs), enc["attention_mask"].float(), torch.tensor(labels))


class CachedClassificationTask:
    """The training loop's task: `train` is what the loop samples, `evaluation` what `evaluate` scores (cross-entropy
    `eval_loss` and `accuracy`). The module maps (h [B, T, D], mask [B, T]) -> logits [B, C].

    `eval_batch_size`: examples per evaluation forward. Kept per experiment: a committed report was computed with its
    own chunking, and another chunk size may round the logits differently.
    """

    metric = "accuracy"
    higher_is_better = True

    def __init__(self, train: CachedInputs, evaluation: CachedInputs, name: str = "cached classification",
                 eval_batch_size: int = 128) -> None:
        self.train, self.evaluation, self.name, self.eval_batch_size = train, evaluation, name, eval_batch_size

    @property
    def num_train(self) -> int:
        return len(self.train)

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"h": self.train.h[indices], "mask": self.train.mask[indices], "labels": self.train.labels[indices]}

    def loss(self, module: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(module(batch["h"], batch["mask"]), batch["labels"])

    @torch.no_grad()
    def logits(self, module: nn.Module, data: CachedInputs) -> torch.Tensor:
        """Logits [N, C] of every example of `data`, in eval mode (the module's mode is restored)."""
        was = module.training
        module.eval()
        try:
            n = self.eval_batch_size
            return torch.cat([module(data.h[i : i + n], data.mask[i : i + n]) for i in range(0, len(data), n)])
        finally:
            module.train(was)

    def evaluate(self, module: nn.Module) -> dict[str, float]:
        logits, labels = self.logits(module, self.evaluation), self.evaluation.labels
        return {"eval_loss": float(F.cross_entropy(logits, labels)), "accuracy": float((logits.argmax(-1) == labels).float().mean())}
