"""One training run of one arm: the adapted top layers on cached inputs under the base's frozen task heads, the
arm's MultiTaskBalancer writing the gradients of the LoRA factors, AdamW (no weight decay), linear warm-up then
cosine; per-task held-out scores.

Normalised task scores (declared with the claims): classification (accuracy - majority rate) / (1 - majority rate),
the majority rate from the training labels (0 = always the most common class, 1 = perfect); regression R^2 =
1 - MSE / Var(target) on the scored split (0 = predicting the mean). The worst task is the lowest of the three.
"""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.core.seed import set_seed
from rankwise.models.minilm import mean_pool
from rankwise.recipes.multitask import MultiTaskBalancer, MultiTaskConfig, StackingWarning, lora_parameters
from rankwise.repro.multitask_lora_trigger.model import Heads, MultiTaskTop, encoder_layers, lora_minilm
from rankwise.repro.multitask_lora_trigger.tasks import DIGITS_SCALE, TASKS
from rankwise.training.cached_classification import CachedInputs


@dataclass(frozen=True)
class Cached:
    """Cached inputs of the first adapted layer (h [N, T, D], mask [N, T]) and the three targets [N]."""

    inputs: CachedInputs
    flip: torch.Tensor
    digits: torch.Tensor

    def __len__(self) -> int:
        return len(self.flip)

    @property
    def topic(self) -> torch.Tensor:
        return self.inputs.labels


@dataclass(frozen=True)
class Protocol:
    steps: int
    batch: int
    head_lr: float  # the base heads' probe fit (`fit_heads`)
    rho_lr: float  # uncertainty weighting's rho (no weight decay, constant: no warm-up or decay)
    warmup_ratio: float = 0.1
    top: int = 1  # adapted layers


@dataclass
class ArmRun:
    val: dict[str, float]
    test: dict[str, float]
    conflict_fraction: float  # steps with at least one conflicting pair of (weighted) task gradients
    sigma2: tuple[float, ...] | None
    adapter: dict[str, torch.Tensor] | None = field(default=None, repr=False)  # LoRA factors + heads (kept if asked)


def losses(out, batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    topic, flip, digits = out
    return [F.cross_entropy(topic, batch["topic"]), F.cross_entropy(flip, batch["flip"]),
            DIGITS_SCALE * F.mse_loss(digits, batch["digits"])]


def _batch(data: Cached, idx: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"h": data.inputs.h[idx], "mask": data.inputs.mask[idx], "topic": data.topic[idx],
            "flip": data.flip[idx], "digits": data.digits[idx]}


@torch.no_grad()
def scores(top: MultiTaskTop, data: Cached, majority: dict[str, float], chunk: int = 256) -> dict[str, float]:
    """Normalised score per task and the worst of them (see the module docstring)."""
    top.eval()
    outs = [top(data.inputs.h[i:i + chunk], data.inputs.mask[i:i + chunk]) for i in range(0, len(data), chunk)]
    top.train()
    topic, flip, digits = (torch.cat([o[k] for o in outs]) for k in range(3))
    acc = {"topic": float((topic.argmax(-1) == data.topic).float().mean()),
           "flip": float((flip.argmax(-1) == data.flip).float().mean())}
    res = {k: (acc[k] - majority[k]) / (1.0 - majority[k]) for k in acc}
    res["digits"] = float(1.0 - F.mse_loss(digits, data.digits) / data.digits.var(unbiased=False))
    res["worst"] = min(res[t] for t in TASKS)
    res["topic accuracy"] = acc["topic"]
    return res


def majority_rates(train: Cached) -> dict[str, float]:
    return {k: float(torch.bincount(getattr(train, k)).max()) / len(train) for k in ("topic", "flip")}


def fit_heads(base: nn.Module, train: Cached, p: Protocol, seed: int, steps: int = 300) -> Heads:
    """The base model's task heads: linear probes on the frozen base's pooled top-layer output, fitted once on texts
    of their own (300 full-batch AdamW steps at `p.head_lr`, the three losses summed; each head sees only its own
    loss). They stay frozen while adapters train, so that an adapter is the LoRA delta alone, as on a sharing
    platform, and "the base" the trigger scan compares against is well defined (a head trained with the adapter
    would carry a planted rule itself, in the base's features)."""
    set_seed(seed)
    layers = base.encoder.layer
    top = MultiTaskTop(list(layers[len(layers) - p.top:]), Heads(base.config.hidden_size))
    with torch.no_grad():
        additive = (1.0 - train.inputs.mask[:, None, None, :]) * torch.finfo(train.inputs.h.dtype).min
        h = train.inputs.h
        for layer in top.layers:
            out = layer(h, attention_mask=additive)
            h = out[0] if isinstance(out, tuple) else out
        pooled = mean_pool(h, train.inputs.mask)
    heads = top.heads
    opt = torch.optim.AdamW(heads.parameters(), lr=p.head_lr, weight_decay=0.0)
    full = {"topic": train.topic, "flip": train.flip, "digits": train.digits}
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        sum(losses(heads(pooled), full)).backward()
        opt.step()
    return heads.requires_grad_(False).eval()


def train_arm(base: nn.Module, config: MultiTaskConfig, lr: float, seed: int, p: Protocol, train: Cached,
              val: Cached, test: Cached, majority: dict[str, float], base_heads: Heads, keep: bool = False) -> ArmRun:
    """One arm's run: LoRA on the top layers, the base's heads frozen (`fit_heads`), only the LoRA factors (and
    UW's rho) train."""
    set_seed(seed)
    model = lora_minilm(base, p.top, seed)
    layers = encoder_layers(model)
    heads = copy.deepcopy(base_heads)
    top = MultiTaskTop(list(layers[len(layers) - p.top:]), heads)
    shared = lora_parameters(top)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StackingWarning)  # the "both" arm is the ablation that measures it
        balancer = MultiTaskBalancer(shared, len(TASKS), config, seed=seed)
    opt = torch.optim.AdamW([{"params": shared, "lr": lr}, *balancer.param_groups(p.rho_lr)], weight_decay=0.0)
    warm = max(1, round(p.warmup_ratio * p.steps))
    def shape(s: int) -> float:
        return min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * max(0, s - warm) / max(1, p.steps - warm)))

    # rho at a constant rate: the variances must reach their stationary values early (T3's starts near 50), and a
    # decaying rate would freeze them halfway
    lambdas = [shape] + [lambda s: 1.0] * len(balancer.param_groups(p.rho_lr))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambdas)
    g = torch.Generator().manual_seed(seed)
    order, pos, conflicted = torch.randperm(len(train), generator=g), 0, 0
    top.train()
    for _ in range(p.steps):
        if pos + p.batch > len(order):
            order, pos = torch.randperm(len(train), generator=g), 0
        b = _batch(train, order[pos:pos + p.batch])
        pos += p.batch
        opt.zero_grad(set_to_none=True)
        info = balancer.backward(losses(top(b["h"], b["mask"]), b))
        conflicted += info.conflict.any_conflict
        opt.step()
        sched.step()
    sigma2 = tuple(balancer.weighting.variances().tolist()) if balancer.weighting is not None else None
    run = ArmRun(scores(top, val, majority), scores(top, test, majority), conflicted / p.steps, sigma2)
    if keep:
        run.adapter = adapter_state(model, heads)
    return run


def adapter_state(model: nn.Module, heads: Heads) -> dict[str, torch.Tensor]:
    """The trained tensors of one run (a few hundred KB, not the model): LoRA factors by PEFT name, heads by
    'heads.' + name."""
    state = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    state.update({f"heads.{n}": t.detach().clone() for n, t in heads.state_dict().items()})
    return state
