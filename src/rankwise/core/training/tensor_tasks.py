"""A task over tensors already in memory: inputs [N, ...] (images, table rows, node features, cached activations)
and integer labels [N], for the one loop. Image pretraining and fine-tuning, tabular and graph-node classification
use it as it is; a method with another loss subclasses it and overrides `loss`."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.errors import InvalidInputError


class TensorClassificationTask:
    """Cross-entropy of `module(inputs)` -> logits [B, C] against labels; `evaluate` scores the held-out tensors
    (in eval mode: batch-norm statistics, not the batch's). Batches are {"inputs": [B, ...], "labels": [B]}."""

    metric = "accuracy"
    higher_is_better = True

    def __init__(self, name: str, inputs: torch.Tensor, labels: torch.Tensor, eval_inputs: torch.Tensor,
                 eval_labels: torch.Tensor, eval_batch_size: int = 512) -> None:
        for what, x, y in (("training", inputs, labels), ("evaluation", eval_inputs, eval_labels)):
            if x.size(0) != y.numel() or y.dim() != 1 or y.dtype != torch.int64:
                raise InvalidInputError(f"{name}: {what} inputs {tuple(x.shape)} need int64 labels [N] of the same N, "
                                        f"got {tuple(y.shape)} {y.dtype}")
            if y.numel() == 0:
                raise InvalidInputError(f"{name}: no {what} examples")
        self.name, self.x, self.y, self.x_eval, self.y_eval = name, inputs, labels, eval_inputs, eval_labels
        self.eval_batch_size = eval_batch_size

    @property
    def num_train(self) -> int:
        return self.y.numel()

    @property
    def num_labels(self) -> int:
        return int(torch.cat([self.y, self.y_eval]).max()) + 1

    def batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"inputs": self.x[indices], "labels": self.y[indices]}

    def loss(self, module: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(module(batch["inputs"]), batch["labels"])

    @torch.no_grad()
    def evaluate(self, module: nn.Module) -> dict[str, float]:
        was_training = module.training
        module.eval()
        try:
            logits = torch.cat([module(self.x_eval[i : i + self.eval_batch_size])
                                for i in range(0, self.y_eval.numel(), self.eval_batch_size)])
        finally:
            module.train(was_training)
        return {"accuracy": float((logits.argmax(-1) == self.y_eval).double().mean()),
                "eval_loss": float(F.cross_entropy(logits, self.y_eval))}
