"""The paper's optimizer: SGD without momentum or other state (any optimizer state would count against the memory
budget), as a factory for the training loop (`train(..., optimizer=sgd())`)."""

from __future__ import annotations

import torch
from torch import nn

from rankwise.core.training.optimizer import OptimizerFactory, trainable_parameters


def sgd() -> OptimizerFactory:
    """torch.optim.SGD over the trainable parameters at the loop's lr, no momentum, the config's weight decay."""

    def make(module: nn.Module, config) -> torch.optim.Optimizer:
        return torch.optim.SGD(trainable_parameters(module), lr=config.lr, momentum=0.0, weight_decay=config.weight_decay)

    make.label = "sgd"  # type: ignore[attr-defined]
    return make
