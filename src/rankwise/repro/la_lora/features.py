"""MiniLM's frozen prefix, cached (`training.prefix_cache`), and the trained tail on it: LoRA on the attention of the
top `n` encoder layers (query and value, optionally more projections), mean pooling and a classification head.

The layers below the first adapted one are a fixed function of the text, so their output h [N, T, 384] (the input of
encoder layer L - n) is computed once per example (`cache_inputs`, the encoder cache of
`training.cached_classification`). The tail (`TopTail`) is a copy of the top `n` layers, frozen, each target
projection wrapped in the library's `AdaptedLinear` with one `LoraAdapter`, run by `training.encoder_top`'s
`EncoderTopClassifier` (BERT's additive mask, vmap-safe for the per-sample gradients). The head is given (pre-trained
on the public split, `public_head`) and frozen unless asked otherwise: what the private training may move is then
the features, not the classifier.

`pooled_features` is the tail's pooled output with the adapter off (B = 0 makes the delta exactly zero): the input of
the head-only control. `check_tail` compares the tail with the full MiniLM forward carrying the same LoRA (the
`prefix-cache-exact` invariant of the report).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from functools import partial

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.adapters import AdaptedLinear, AdapterSite, LoraAdapter, LoraConfig, SharedParameters
from rankwise.errors import InvalidInputError
from rankwise.models.minilm import mean_pool
from rankwise.training.encoder_top import EncoderTopClassifier
from rankwise.training.prefix_cache import batches, chunks, eval_mode, module_inputs

ADAPTER = "default"
# The projections of each tail layer that carry LoRA (module paths inside a BertLayer); the paper adapts attention.
DEFAULT_TARGETS = ("attention.self.query", "attention.self.value")


def first_tail_layer(model: nn.Module, top: int) -> int:
    """The index of the lowest adapted encoder layer when the top `top` layers are adapted."""
    n = len(model.encoder.layer)
    if not isinstance(top, int) or isinstance(top, bool) or not 1 <= top <= n:
        raise InvalidInputError(f"the tail must hold between 1 and the model's {n} encoder layers, got top={top!r}")
    return n - top


@torch.no_grad()
def cache_inputs(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, top: int,
                 batch: int = 64) -> dict[str, torch.Tensor]:
    """{h [N, T, D]: the input of encoder layer L - top, mask [N, T] (float, 1 = token)} for token ids [N, T]
    (right-padded, mask [N, T]). The forward stops at that layer: nothing above it runs."""
    if ids.shape != mask.shape or ids.dim() != 2:
        raise InvalidInputError(f"ids and mask must both be [N, T], got {tuple(ids.shape)} and {tuple(mask.shape)}")
    layer = model.encoder.layer[first_tail_layer(model, top)]
    with eval_mode(model):  # a cached dropout draw would be frozen into every epoch
        hs = [module_inputs(layer, partial(model, input_ids=ids[part], attention_mask=mask[part])).first()
              for part in batches(ids.size(0), batch)]
    return {"h": torch.cat(hs), "mask": mask.float()}


def _lora(base: nn.Linear, name: str, r: int, alpha: float) -> LoraAdapter:
    """The library's LoRA on `base` (A Kaiming-uniform in PEFT's draw order, B = 0: the delta starts at zero)."""
    site = AdapterSite(name, name, None, base, ADAPTER, SharedParameters())
    return LoraAdapter(site, LoraConfig(r=r, lora_alpha=alpha, target_modules=[name]))


class TopTail(EncoderTopClassifier):
    """The top encoder layers (copied, frozen) with LoRA on `targets`, mean pooling and `head` (copied; frozen
    unless `train_head`). forward(h [B, T, D], mask [B, T]) -> logits [B, C].

    Trained tensors are the LoRA factors, named `...A` / `...B` (LA-LoRA's roles read the names), and the head's
    only when `train_head`."""

    def __init__(self, layers: Sequence[nn.Module], head: nn.Linear, r: int, alpha: float,
                 targets: Sequence[str] = DEFAULT_TARGETS, train_head: bool = False) -> None:
        if not layers:
            raise InvalidInputError("the tail needs at least one encoder layer")
        if not targets:
            raise InvalidInputError("the tail needs at least one LoRA target projection (e.g. attention.self.query)")
        copies = [copy.deepcopy(layer).requires_grad_(False).eval() for layer in layers]
        for layer in copies:
            # Eager attention (explicit matmul + softmax): torch.func.vmap has no batching rule for the CPU SDPA
            # kernel and would loop over the samples of every per-sample gradient. The copy's config is its own.
            config = getattr(layer.attention.self, "config", None)
            if config is not None:
                config._attn_implementation = "eager"
        super().__init__(copies, head.in_features, head.out_features)
        self.head.load_state_dict(head.state_dict())
        self.head.requires_grad_(train_head)
        for i, layer in enumerate(self.layers):
            for path in targets:
                base = layer.get_submodule(path)
                if not isinstance(base, nn.Linear):
                    raise InvalidInputError(f"LoRA target {path!r} of tail layer {i} is a {type(base).__name__}, not an "
                                            "nn.Linear; targets are paths inside a BertLayer, e.g. attention.self.query")
                wrapped = AdaptedLinear(base)
                wrapped.adapters[ADAPTER] = _lora(base, f"layers.{i}.{path}", r, alpha)
                wrapped.active = (ADAPTER,)
                parent, _, child = path.rpartition(".")
                setattr(layer.get_submodule(parent) if parent else layer, child, wrapped)
        self.eval()  # dropout off: the per-sample gradients and the cache see the same deterministic function

    def loras(self) -> dict[str, LoraAdapter]:
        """'layers.i.path' -> its LoRA adapter."""
        return {n.removesuffix(f".adapters.{ADAPTER}"): m for n, m in self.named_modules() if isinstance(m, LoraAdapter)}

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.pooled(h, mask))

    def pooled(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The head's input: the top layer's output mean-pooled over the mask, [B, D]."""
        additive = (1.0 - mask[:, None, None, :].to(h.dtype)) * torch.finfo(h.dtype).min  # BERT's extended mask
        for layer in self.layers:
            out = layer(h, attention_mask=additive)
            h = out[0] if isinstance(out, tuple) else out
        return mean_pool(h, mask)


def tail_logits(module: TopTail, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The federated model's logits: batch {h [B, T, D], mask [B, T]} -> [B, C]."""
    return module(batch["h"], batch["mask"])


class PooledHead(nn.Module):
    """The head-only control: the head on fixed pooled features {pooled [B, D]} -> logits [B, C]."""

    def __init__(self, head: nn.Linear) -> None:
        super().__init__()
        self.head = nn.Linear(head.in_features, head.out_features)
        self.head.load_state_dict(head.state_dict())


def head_logits(module: PooledHead, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return module.head(batch["pooled"])


@torch.no_grad()
def pooled_features(tail: TopTail, data: Mapping[str, torch.Tensor], batch: int = 128) -> torch.Tensor:
    """The tail's pooled output [N, D] over cached {h, mask}: with B = 0 the LoRA delta is exactly zero, so this is
    the frozen model's feature (refused otherwise: it would not be the adapter-off control)."""
    if any(bool(lora.B.any()) for lora in tail.loras().values()):
        raise InvalidInputError("pooled_features is the adapter-off feature: it needs a tail whose LoRA B factors are zero")
    return torch.cat([tail.pooled(part["h"], part["mask"]) for part in chunks(dict(data), batch)])


def fit_public_head(pooled: torch.Tensor, labels: torch.Tensor, num_labels: int, weight_decay: float,
                    iterations: int = 200) -> nn.Linear:
    """A linear head fitted non-privately on public features pooled [P, D] with labels [P]: full-batch L-BFGS on
    cross-entropy + (weight_decay / 2) ||W||^2, from zero (deterministic)."""
    if pooled.dim() != 2 or labels.shape != (pooled.size(0),):
        raise InvalidInputError(f"public features must be [P, D] with labels [P], got {tuple(pooled.shape)} and "
                                f"{tuple(labels.shape)}")
    if not weight_decay >= 0:
        raise InvalidInputError(f"the public head's weight_decay must be >= 0, got {weight_decay}")
    head = nn.Linear(pooled.size(1), num_labels)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    opt = torch.optim.LBFGS(head.parameters(), lr=1.0, max_iter=iterations, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(head(pooled), labels) + 0.5 * weight_decay * head.weight.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return head.requires_grad_(False)


@torch.no_grad()
def accuracy(module: nn.Module, logits, data: Mapping[str, torch.Tensor], batch: int = 256) -> float:
    """Fraction of `data`'s examples (tensors [N, ...] with labels [N]) whose argmax of `logits(module, part)` is right."""
    correct = 0
    for part in chunks(dict(data), batch):
        correct += int((logits(module, part).argmax(-1) == part["labels"]).sum())
    return correct / data["labels"].size(0)


@torch.no_grad()
def check_tail(model: nn.Module, tail: TopTail, ids: torch.Tensor, mask: torch.Tensor,
               cached: Mapping[str, torch.Tensor]) -> float:
    """max |full-model logits - tail logits| / max |logits|: the full MiniLM forward with the tail's LoRA added to
    the same projections by forward hooks, against the tail on the cached inputs of the same examples."""
    start = len(model.encoder.layer) - len(tail.layers)
    handles = []
    for name, lora in tail.loras().items():
        index, _, path = name.removeprefix("layers.").partition(".")
        target = model.encoder.layer[start + int(index)].get_submodule(path)
        handles.append(target.register_forward_hook(lambda _m, args, out, lora=lora: out + lora(args[0])))
    try:
        with eval_mode(model):
            hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    finally:
        for handle in handles:
            handle.remove()
    full = tail.head(mean_pool(hidden, mask))
    part = tail(cached["h"], cached["mask"])
    return float((full - part).abs().max() / full.abs().max())
