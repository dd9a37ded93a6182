"""The model family of the loss-curve-collapse reproduction and one training run of it.

Byte-level (257-token) Llama decoders from `rankwise.models.tiny`, 2 layers, head dim 16, SwiGLU MLP 4d, untied
embeddings, trained on the wiki corpus through `rankwise.training.train`. muP-lite (the card's CPU recipe), with
base width d0 = 32: hidden-matrix learning rate x d0/d, hidden-matrix init std x sqrt(d0/d), output logits x d0/d.
Every member trains for TPP x N tokens (N = non-embedding parameters) with the paper's and the card's schedule (5%
linear warmup, then linear decay to zero: the same shape, in fractions of training, for every member) and AdamW
(0.9, 0.95) with decay from the timescale rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from rankwise.errors import InvalidInputError
from rankwise.models.tiny import tiny_llama
from rankwise.recipes.loss_curve_collapse import Curve, timescale, timescale_adamw, timescale_in_steps
from rankwise.repro.loss_curve_collapse.faults import LRSpikeAdamW, StuckDataTask
from rankwise.training import LanguageModelingTask, TrainConfig, train

BASE_WIDTH = 32
HEAD_DIM = 16
LAYERS = 2
VOCAB = 257  # rankwise.data.compact_vocab.byte_tokenizer()
HIDDEN = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
INIT_STD = 0.02  # the Llama default at the base width
WARMUP_RATIO = 0.05  # the card's warmup, a fraction of training so that every member shares the schedule's shape
DECAY = "linear"  # warmup then linear decay to zero (Celerity's schedule); the harness's default is cosine


class MupCausalLM(nn.Module):
    """A Llama causal LM whose logits are multiplied by d0/d (muP's output multiplier). forward -> .loss, .logits"""

    def __init__(self, lm: nn.Module, logit_scale: float) -> None:
        super().__init__()
        self.lm, self.logit_scale = lm, logit_scale

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> SimpleNamespace:
        hidden = self.lm.model(input_ids=input_ids).last_hidden_state  # [B, T, d]
        logits = self.lm.lm_head(hidden) * self.logit_scale  # [B, T, V]
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1))
        return SimpleNamespace(loss=loss, logits=logits)


def is_hidden(name: str) -> bool:
    return any(f".{h}." in name for h in HIDDEN)


def build_model(width: int, seed: int) -> MupCausalLM:
    lm = tiny_llama(seed=seed, vocab_size=VOCAB, hidden_size=width, num_layers=LAYERS, num_heads=width // HEAD_DIM,
                    num_kv_heads=width // HEAD_DIM, intermediate_size=4 * width, tie_word_embeddings=False)
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed + 7)
        for name, p in lm.named_parameters():
            if is_hidden(name) and p.dim() == 2:
                p.normal_(0.0, INIT_STD * math.sqrt(BASE_WIDTH / width))
    return MupCausalLM(lm, BASE_WIDTH / width)


def non_embedding_params(model: MupCausalLM) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n and "lm_head" not in n)


def mup_lr_ratio(width: int):
    ratio = BASE_WIDTH / width
    return lambda name, p: ratio if is_hidden(name) else 1.0


@dataclass(frozen=True)
class RunSpec:
    width: int
    tpp: float  # tokens per (non-embedding) parameter
    lr: float  # peak base learning rate (hidden matrices get lr * d0 / d)
    rule: str  # "tau": weight decay from a fixed timescale; "lambda": a fixed weight decay
    value: float  # tau or lambda
    seed: int
    fault: str | None = None  # None, "lr_spike" or "stuck_data"


@dataclass
class RunResult:
    spec: RunSpec
    curve: Curve  # per-step training loss against t_hat (tokens seen / total)
    eval_loss: float  # held-out loss after the last step (the validation score)
    steps: int
    params: int
    hidden_tau: float  # the hidden matrices' timescale
    group_taus: tuple[float, ...]  # B / (eta_g lambda_g D) of every decayed group, from the optimizer's own settings
    wall_s: float


def steps_for(width: int, tpp: float, batch_tokens: int) -> tuple[int, int]:
    """(optimizer steps, non-embedding N) of a member of `width` trained for `tpp` x N tokens in batches of
    `batch_tokens` (at least 10 steps, so a smoke run still has a warmup and a decay)."""
    if width < HEAD_DIM or width % HEAD_DIM:
        raise InvalidInputError(f"width must be a positive multiple of the head dim {HEAD_DIM}, got {width}")
    if not (tpp > 0 and math.isfinite(tpp)) or batch_tokens < 1:
        raise InvalidInputError(f"need TPP > 0 and at least one token per batch, got TPP {tpp}, {batch_tokens} tokens")
    n = non_embedding_params(build_model(width, 0))
    return max(10, int(round(tpp * n / batch_tokens))), n


def run_one(spec: RunSpec, train_windows: torch.Tensor, eval_windows: torch.Tensor, batch_size: int,
            fault_at: float, fault_len: float, spike: float) -> RunResult:
    seq = train_windows.size(1)
    steps, n = steps_for(spec.width, spec.tpp, batch_size * seq)
    model = build_model(spec.width, spec.seed)
    task = LanguageModelingTask(train_windows, eval_windows, eval_batch_size=64)
    start, stop = int(round(fault_at * steps)), int(round((fault_at + fault_len) * steps))
    opt_class = torch.optim.AdamW
    if spec.fault == "lr_spike":
        opt_class = LRSpikeAdamW.over(start, max(stop, start + 1), spike)
    elif spec.fault == "stuck_data":
        task = StuckDataTask(train_windows, eval_windows, start, max(stop, start + 1), eval_batch_size=64)
    kw = {"tau": spec.value} if spec.rule == "tau" else {"weight_decay": spec.value}
    factory = timescale_adamw(lr_ratio=mup_lr_ratio(spec.width), optimizer_class=opt_class, **kw)
    config = TrainConfig(steps=steps, batch_size=batch_size, lr=spec.lr, warmup_ratio=WARMUP_RATIO, min_lr_ratio=0.0,
                         decay=DECAY, max_grad_norm=1.0, eval_every=0, seed=spec.seed)
    result = train(model, task, config, optimizer=factory)
    hidden_lr = spec.lr * BASE_WIDTH / spec.width
    hidden_tau = spec.value if spec.rule == "tau" else timescale_in_steps(hidden_lr, spec.value, steps)
    tokens = np.array([h["tokens"] for h in result.history], dtype=np.float64)
    curve = Curve.from_steps(result.losses, tokens)
    d = float(tokens[-1])
    group_taus = tuple(timescale(d / steps, g["lr"], g["weight_decay"], d)
                       for g in result.optimizer.param_groups if g["weight_decay"] > 0)
    return RunResult(spec, curve, float(result.final["eval_loss"]), steps, n, float(hidden_tau), group_taus,
                     result.wall_s)
