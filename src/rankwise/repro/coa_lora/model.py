"""The experiment's model: MiniLM's top encoder layers (adapted, quantized) on cached inputs, a linear head.

The layers below the quantized ones stay full precision and frozen, so their output is a fixed function of the
text: computed once per example (`cached_inputs`) and fed to the top layers, which is what makes dozens of runs fit
the budget on one CPU thread.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

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


class CachedTopicTask:
    """Classification on cached top-layer inputs: train (h, mask, labels) and one evaluation set."""

    name = "wiki-topics (cached prefix)"
    metric = "accuracy"
    higher_is_better = True

    def __init__(self, train: tuple[torch.Tensor, ...], evaluation: tuple[torch.Tensor, ...]) -> None:
        self.train_h, self.train_mask, self.train_labels = train
        self.eval_h, self.eval_mask, self.eval_labels = evaluation

    @property
    def num_train(self) -> int:
        return self.train_h.size(0)

    def batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"h": self.train_h[indices], "mask": self.train_mask[indices], "labels": self.train_labels[indices]}

    def loss(self, module: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(module(batch["h"], batch["mask"]), batch["labels"])

    @torch.no_grad()
    def accuracy(self, module: nn.Module, h: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> float:
        was = module.training
        module.eval()
        try:
            logits = torch.cat([module(h[i : i + 128], mask[i : i + 128]) for i in range(0, h.size(0), 128)])
        finally:
            module.train(was)
        return float((logits.argmax(-1) == labels).float().mean())

    def evaluate(self, module: nn.Module) -> dict[str, float]:
        return {"accuracy": self.accuracy(module, self.eval_h, self.eval_mask, self.eval_labels)}


@torch.no_grad()
def cached_inputs(model: nn.Module, tokenizer, texts: list[str], labels: list[int], max_length: int, start: int) -> tuple[torch.Tensor, ...]:
    """The frozen layers' output (layer `start`'s input) [N, T, D], the mask [N, T] and the labels [N]."""
    enc = tokenizer(texts, truncation=True, max_length=max_length, padding="max_length", return_tensors="pt")
    hs = [model(input_ids=enc["input_ids"][i : i + 64], attention_mask=enc["attention_mask"][i : i + 64],
                output_hidden_states=True).hidden_states[start] for i in range(0, len(texts), 64)]
    return torch.cat(hs), enc["attention_mask"].float(), torch.tensor(labels)
