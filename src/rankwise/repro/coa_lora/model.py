"""The experiment's model: MiniLM's top encoder layers (adapted, quantized) on cached inputs, a linear head.

The layers below the quantized ones stay full precision and frozen, so their output is a fixed function of the
text: computed once per example (`training.cached_classification.cache_encoder_inputs`) and fed to the top layers, which is what makes dozens of runs fit
the budget on one CPU thread.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from rankwise.adapters import add_adapter
from rankwise.adapters.config import AdapterConfig
from rankwise.training.encoder_top import EncoderTopClassifier


TopClassifier = EncoderTopClassifier  # holds the adapted model's shared parameters (CoA-LoRA's network) as `shared`


def build_classifier(base: nn.Module, config: AdapterConfig, top: int, num_labels: int, seed: int) -> TopClassifier:
    """A fresh copy of `base` with `config`'s adapter on its top `top` layers, as a TopClassifier (eval mode off)."""
    torch.manual_seed(seed)
    model = copy.deepcopy(base)
    n = len(model.encoder.layer)
    config.layers_to_transform = list(range(n - top, n))
    adapted = add_adapter(model, config)
    with torch.random.fork_rng():
        torch.manual_seed(seed + 7919)  # the same head initialisation in every arm at this seed
        clf = TopClassifier(list(model.encoder.layer[n - top :]), model.config.hidden_size, num_labels, adapted.shared)
    clf.adapted = [adapted]  # kept (unregistered) for saving; a list so nn.Module does not register it
    return clf
