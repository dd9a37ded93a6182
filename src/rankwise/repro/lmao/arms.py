"""The four arms of the LMAO reproduction on the cached top layers, each run for a given learning rate and seed.

- "LoRA": first-order LoRA (query, value) with AdamW, the head at HEAD_LR;
- "LMAO": the same LoRA phase plus the ZO phase on every frozen tensor of the top layers (`rankwise.optim.lmao.procedure`);
- "MeZO": zeroth-order SGD on every tensor of the top layers and the head, two forwards per step, no backward;
- "full FT": AdamW on every tensor of the top layers, the head at HEAD_LR (the first-order reference).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from rankwise.adapters import LoraConfig, add_adapter
from rankwise.core.seed import set_seed
from rankwise.errors import NumericalError
from rankwise.optim.lmao import base_snapshot
from rankwise.optim.zeroth_order import SPSA, numerical_rank, step_seed
from rankwise.training import TrainConfig, train
from rankwise.training.cached_classification import CachedClassificationTask
from rankwise.training.encoder_top import EncoderTopClassifier
from rankwise.optim.lmao.procedure import lmao_procedure
from rankwise.core.training.loop import batch_indices

LORA, LMAO, MEZO, FULL_FT = "LoRA", "LMAO", "MeZO", "full FT"
HEAD_LR = 3e-3  # the head's rate in every first-order arm (AdamW, same schedule)
EPS = 1e-3  # SPSA perturbation scale, fixed as in the paper


@dataclass(frozen=True)
class Shape:
    top_layers: int
    rank: int
    steps: int
    batch: int


@dataclass
class Fit:
    accuracy: float
    eval_loss: float
    trainable: int  # first-order trainable parameters (the head included); MeZO: ZO parameters
    zo_params: int  # parameters the ZO phase updates
    wall_s: float
    base_delta: dict[str, torch.Tensor] = field(default_factory=dict)  # LMAO: W_T - W_0 of its 2-D tensors
    state: dict[str, torch.Tensor] = field(default_factory=dict)  # final trainable tensors (for bit comparisons)


def build(arm: str, base: nn.Module, shape: Shape, num_labels: int, seed: int) -> EncoderTopClassifier:
    """The top layers of a copy of `base` (LoRA-adapted for LoRA/LMAO) with a fresh head; same head at a seed."""
    set_seed(seed)
    model = copy.deepcopy(base)
    n = model.config.num_hidden_layers
    top = list(range(n - shape.top_layers, n))
    if arm in (LORA, LMAO):
        add_adapter(model, LoraConfig(r=shape.rank, lora_alpha=2.0 * shape.rank, target_modules=["query", "value"],
                                      layers_to_transform=top))
    else:
        model.requires_grad_(arm == FULL_FT)
    with torch.random.fork_rng():
        torch.manual_seed(seed + 7919)
        clf = EncoderTopClassifier(model.encoder.layer[n - shape.top_layers :], model.config.hidden_size, num_labels)
    return clf


def trainer_optimizer(module: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """AdamW for the first-order arms: the head (parameters named head.*) at HEAD_LR, the rest at the arm's rate."""
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    head = [p for n, p in named if n.startswith("head.")]
    rest = [p for n, p in named if not n.startswith("head.")]
    return torch.optim.AdamW([{"params": rest, "lr": config.lr}, {"params": head, "lr": HEAD_LR}], lr=config.lr, weight_decay=0.0)


trainer_optimizer.label = f"adamw(head_lr={HEAD_LR})"  # type: ignore[attr-defined]


def fit(arm: str, base: nn.Module, task: CachedClassificationTask, shape: Shape, num_labels: int, seed: int, lr: float,
        base_lr: float = 0.0, steps: int | None = None) -> Fit:
    """Train one arm; `lr` is the first-order rate (MeZO: its ZO rate), `base_lr` LMAO's eta_W. Diverged: NaN scores."""
    clf = build(arm, base, shape, num_labels, seed)
    steps = steps or shape.steps
    trainable = sum(p.numel() for p in clf.parameters() if p.requires_grad)
    try:
        if arm == MEZO:
            return train_mezo(clf, task, shape, seed, lr, steps)
        procedure = lmao_procedure(clf, task, seed, base_lr=base_lr, eps=EPS) if arm == LMAO else None
        before = base_snapshot([(n, p) for n, p in procedure.tensors if p.dim() == 2]) if procedure else {}
        res = train(clf, task, TrainConfig(steps=steps, batch_size=shape.batch, lr=lr, warmup_ratio=0.1, seed=seed),
                    optimizer=trainer_optimizer, procedure=procedure)
    except NumericalError:
        return Fit(float("nan"), float("nan"), trainable, 0, 0.0)
    delta = {n: p.detach() - before[n] for n, p in procedure.tensors if n in before} if procedure else {}
    state = {n: p.detach().clone() for n, p in clf.named_parameters() if p.requires_grad}
    return Fit(res.final["accuracy"], res.final["eval_loss"], trainable, procedure.spsa.numel if procedure else 0,
               res.wall_s, delta, state)


def train_mezo(clf: nn.Module, task: CachedClassificationTask, shape: Shape, seed: int, lr: float, steps: int) -> Fit:
    """MeZO: SGD with the SPSA estimate on every tensor (constant lr, eps fixed), the loop's batch order."""
    import time

    t0 = time.perf_counter()
    clf.requires_grad_(False)
    params = list(clf.named_parameters())
    spsa = SPSA(clf, params, EPS)
    clf.eval()  # no dropout in either ZO forward
    for step in range(steps):
        batch = task.batch(batch_indices(step, shape.batch, task.num_train, seed))
        with torch.inference_mode():
            plus, minus, g = spsa.projected_gradient(lambda: task.loss(clf, batch), step_seed(seed, step))
        if not math.isfinite(g) or abs(g) > 1e6:
            return Fit(float("nan"), float("nan"), spsa.numel, spsa.numel, time.perf_counter() - t0)
        spsa.step_from(plus, minus, g, step_seed(seed, step), lr)
    final = task.evaluate(clf)
    ok = math.isfinite(final["eval_loss"])
    return Fit(final["accuracy"] if ok else float("nan"), final["eval_loss"], spsa.numel, spsa.numel, time.perf_counter() - t0)


def full_rank_fraction(delta: dict[str, torch.Tensor]) -> float:
    """min over 2-D tensors of numerical_rank(dW) / min(m, n): 1.0 when every base update is full rank."""
    return min(numerical_rank(d) / min(d.shape) for d in delta.values())
