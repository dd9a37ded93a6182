"""The continual-training arms over time blocks, from one pretrained item-Llama.

Stage t = 1 .. T-2 trains a LoRA adapter on block t and the model is then evaluated on block t+1:
- single:     one adapter, inherited stage to stage (v_t <- v_{t-1}), no regulariser (PESO with lam = 0);
- peso:       the same, plus lam * softmax-KL to a frozen snapshot of the previous stage's adapter;
- l2:         the same, plus the L2 proximal (H = I) to that snapshot;
- cumulative: a new adapter per stage (B = 0 start) on top of the frozen sum of all earlier ones.
Stage 1 has no previous adapter, so no arm is regularised there. In every arm the tied item embeddings are trained
fully and never regularised (the paper's modules_to_save), so new items can be learnt.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from rankwise.adapters import AdaptedModel, LoraConfig
from rankwise.adapters.peso import ProximalRegularizer, Snapshot
from rankwise.repro.peso.data import Sequences, Windows
from rankwise.repro.peso.model import NextItemTask, item_llama, target_ranks
from rankwise.training import TrainConfig, train
from rankwise.adapters.peso.procedure import PesoProcedure

ARMS = ("single", "peso", "l2", "cumulative")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class StageSettings:
    hidden: int
    layers: int
    rank: int
    epochs: int
    batch: int
    weight_decay: float


@dataclass
class ContinualRun:
    """ranks[block] = rank of every target of that block (same order as `eval_windows[block]`)."""

    arm: str
    lr: float
    lam: float
    seed: int
    ranks: dict[int, torch.Tensor] = field(default_factory=dict)
    trainable: int = 0
    steps: int = 0
    kl_at_start: list[float] = field(default_factory=list)  # the proximal term at each regularised stage's start


def stage_steps(windows: Windows, s: StageSettings) -> int:
    return max(1, s.epochs * -(-windows.tokens.size(0) // s.batch))


def run_continual(arm: str, lr: float, lam: float, seed: int, base_state: dict[str, torch.Tensor], seqs: Sequences,
                  train_windows: dict[int, Windows], eval_windows: dict[int, Windows], s: StageSettings,
                  stages: list[int]) -> ContinualRun:
    """Train `arm` over `stages` (block indices), evaluating on block t+1 after stage t."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}")
    torch.manual_seed(seed)
    model = item_llama(seqs.vocab_size, 0, s.hidden, s.layers)
    model.load_state_dict(base_state)
    adapted = AdaptedModel(model)
    config = LoraConfig(r=s.rank, lora_alpha=2.0 * s.rank, target_modules=TARGETS)
    run = ContinualRun(arm, lr, lam, seed)
    anchor: Snapshot | None = None
    names: list[str] = []
    for t in stages:
        if arm == "cumulative" or not names:
            names.append(f"stage{t}" if arm == "cumulative" else "default")
            torch.manual_seed(seed * 1000 + t)  # each new adapter's init: a function of (seed, stage)
            adapted.add_adapter(names[-1], config)
            adapted.set_adapter(names)
            for old in names[:-1]:  # earlier adapters act in the forward, frozen
                for p in (q for a in adapted.adapters_of(old).values() for q in a.parameters()):
                    p.requires_grad_(False)
        model.model.embed_tokens.weight.requires_grad_(True)  # tied with lm_head; not regularised
        procedure = None
        if arm in ("peso", "l2") and anchor is not None:
            procedure = PesoProcedure(adapted, ProximalRegularizer(anchor, lam, "kl" if arm == "peso" else "l2"))
            run.kl_at_start.append(float(procedure.regularizer(procedure.factors).detach()))
        steps = stage_steps(train_windows[t], s)
        config_t = TrainConfig(steps=steps, batch_size=s.batch, lr=lr, weight_decay=s.weight_decay, warmup_ratio=0.05,
                               seed=seed * 1000 + t)
        train(adapted, NextItemTask(train_windows[t], f"block{t}"), config_t, procedure=procedure)
        if arm in ("peso", "l2", "single"):
            anchor = Snapshot.of(adapted)  # only the latest stage's adapter is kept (for peso / l2)
        run.steps += steps
        run.trainable = sum(p.numel() for n in names[-1:] for a in adapted.adapters_of(n).values() for p in a.parameters())
        run.ranks[t + 1] = target_ranks(adapted, eval_windows[t + 1], seqs)
    return run


def pretrain(seqs: Sequences, windows: Windows, s: StageSettings, steps: int, lr: float, seed: int) -> nn.Module:
    """The base recommender: every weight trained on block 0."""
    torch.manual_seed(seed)
    model = item_llama(seqs.vocab_size, seed, s.hidden, s.layers).requires_grad_(True)
    train(model, NextItemTask(windows, "block0"), TrainConfig(steps=steps, batch_size=s.batch, lr=lr, weight_decay=0.01,
                                                              warmup_ratio=0.05, seed=seed))
    return model.eval()

