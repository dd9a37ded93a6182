"""Models for federated LoRA jobs: a vmap-safe classifier forward and a builder that client processes call.

`classifier_logits(classifier, batch)` computes what `SequenceClassifier.forward` computes, but hands the backbone
an additive 4-D attention mask: transformers' own mask builder inspects the mask's values (`mask.all()`) to skip
work, which `torch.func.vmap` (the per-sample gradients) cannot trace.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from rankwise.errors import InvalidInputError
from rankwise.models.minilm import mean_pool
from rankwise.training.federated.config import FederatedModel
from rankwise.training.tasks import SequenceClassifier


def classifier_logits(classifier: SequenceClassifier, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """batch {input_ids [B, T], attention_mask [B, T]} -> logits [B, num_labels]; right padding."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    keep = mask[:, None, None, :].bool()  # [B, 1, 1, T]: which keys a query may attend to
    if classifier.pooling == "last":  # a causal LM: a 4-D mask replaces the model's own, so add causality here
        t = ids.size(1)
        keep = keep & torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()[None, None]
    dtype = classifier.head.weight.dtype
    additive = torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)
    hidden = classifier._backbone(input_ids=ids, attention_mask=additive).last_hidden_state
    if classifier.pooling == "mean":
        pooled = mean_pool(hidden, mask)
    else:  # the last real token: a one-hot over positions (vmap-safe gather)
        last = mask.long().sum(1).clamp_min(1) - 1
        pick = torch.nn.functional.one_hot(last, ids.size(1)).to(hidden.dtype)
        pooled = (hidden * pick[..., None]).sum(1)
    return classifier.head(pooled)


def classifier_model(classifier: SequenceClassifier) -> FederatedModel:
    if not isinstance(classifier, SequenceClassifier):
        raise InvalidInputError(f"a federated classification job needs a SequenceClassifier (task.wrap(model)), got {type(classifier).__name__}")
    return FederatedModel(classifier, classifier_logits)


def adapted_classifier(base: Mapping[str, Any], num_labels: int, adapter: Mapping[str, Any], seed: int = 0) -> FederatedModel:
    """Build base model + LoRA + head (what a client process rebuilds): base {"embedded": "minilm-l6"} or
    {"tiny_bert": {tiny_bert kwargs}}; adapter {"rank": r, "targets": [...], "top_k_layers": k, "options": {...}}.
    The trained tensors' values do not matter: the server sends them every round."""
    from rankwise.adapters import adapt
    from rankwise.models import load_model, tiny_bert

    if "tiny_bert" in base:
        model = tiny_bert(**base["tiny_bert"])
    elif "embedded" in base:
        model, _ = load_model(base["embedded"])
    else:
        raise InvalidInputError(f"base must name 'embedded' or 'tiny_bert', got {sorted(base)}")
    torch.manual_seed(seed)
    adapted = adapt(model, "lora", int(adapter["rank"]), adapter.get("targets"), adapter.get("top_k_layers"),
                    **adapter.get("options", {}))
    return classifier_model(SequenceClassifier(adapted, num_labels))
