"""Sequence classification on cached encoder inputs, the encoder part of the prefix cache (`training.prefix_cache`):
when only the top layers of a BERT-style encoder (MiniLM) are adapted, the layers below are a fixed function of the
text, so their output (the input of layer `start`) is computed once per example (`cache_encoder_inputs`) and a
training step runs only the top layers and the head (`training.encoder_top.EncoderTopClassifier`).
`CachedClassificationTask` is the loop's task over such a cache.

    start = len(model.encoder.layer) - top                      # the first adapted layer
    train = cache_encoder_inputs(model, tokenizer, texts, labels, max_length=16, start=start)
    task = CachedClassificationTask(train, held_out, name="wiki-topics (cached prefix)")
    train(EncoderTopClassifier(model.encoder.layer[start:], hidden, num_labels), task, config)
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.errors import InvalidInputError
from rankwise.training.prefix_cache import CachedExamples, CachedTask, batches, eval_mode, module_inputs


class CachedInputs(CachedExamples):
    """The first adapted layer's input h [N, T, D], its attention mask [N, T] (1.0 = token) and the labels [N]."""

    def __init__(self, h: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> None:
        super().__init__(h=h, mask=mask, labels=labels)


@torch.no_grad()
def cache_encoder_inputs(model: nn.Module, tokenizer, texts: list[str], labels: list[int], max_length: int, start: int,
                         batch_size: int = 64) -> CachedInputs:
    """The input of the encoder's layer `start` (the output of the layers below it) for each text, every text padded
    to `max_length` tokens (so one mask shape serves all batches). `model`: a transformers encoder (MiniLM)."""
    layers = model.encoder.layer
    if not 0 <= start < len(layers):
        raise InvalidInputError(f"start must be a layer index in 0..{len(layers) - 1}, got {start}")
    enc = tokenizer(texts, truncation=True, max_length=max_length, padding="max_length", return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    hs = [module_inputs(layers[start], partial(model, input_ids=ids[part], attention_mask=mask[part])).first()
          for part in batches(len(texts), batch_size)]
    return CachedInputs(torch.cat(hs), mask.float(), torch.tensor(labels))


class CachedClassificationTask(CachedTask):
    """The training loop's task: `train` is what the loop samples, `evaluation` what `evaluate` scores (cross-entropy
    `eval_loss` and `accuracy`). The module maps (h [B, T, D], mask [B, T]) -> logits [B, C].

    `eval_batch_size`: examples per evaluation forward. Kept per experiment: a committed report was computed with its
    own chunking, and another chunk size may round the logits differently.
    """

    metric = "accuracy"
    higher_is_better = True

    def __init__(self, train: CachedInputs, evaluation: CachedInputs, name: str = "cached classification",
                 eval_batch_size: int = 128) -> None:
        super().__init__(train)
        self.evaluation, self.name, self.eval_batch_size = evaluation, name, eval_batch_size

    @property
    def train(self) -> CachedInputs:
        """The training cache (`train_set`)."""
        return self.train_set

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def loss(self, module: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(module(batch["h"], batch["mask"]), batch["labels"])

    @torch.no_grad()
    def logits(self, module: nn.Module, data: CachedInputs) -> torch.Tensor:
        """Logits [N, C] of every example of `data`, in eval mode (the module's mode is restored)."""
        with eval_mode(module):
            return torch.cat([module(part["h"], part["mask"]) for part in data.chunks(self.eval_batch_size)])

    def evaluate(self, module: nn.Module) -> dict[str, float]:
        logits, labels = self.logits(module, self.evaluation), self.evaluation.labels
        return {"eval_loss": float(F.cross_entropy(logits, labels)), "accuracy": float((logits.argmax(-1) == labels).float().mean())}
