"""One training run of a recall model on MQAR: AdamW, warmup + cosine, batches cycling over the kv-pair counts, on the
one fitting loop (`core.training.fit`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from rankwise.core.training import fit
from rankwise.core.training.schedule import warmup_times_cosine
from rankwise.repro.mixture_of_memories.data import IGNORE, mqar_batch, vocab_size
from rankwise.repro.mixture_of_memories.model import EXPANDED, RecallModel, aux_loss, make_mixer, n_params

AUX_SCALE = 0.01  # the paper's aux_loss_scale


@dataclass(frozen=True)
class ModelShape:
    d_model: int
    layers: int
    heads: int
    head_dim: int
    memories: int
    top_k: int
    expanded_key_dim: int  # key size per head of the expanded single memory
    expanded_mlp_hidden: int  # its SwiGLU width (the others: 2 d_model)
    key_vocab: int
    value_vocab: int


@dataclass(frozen=True)
class RunResult:
    params: int
    val_acc: dict[int, float]  # kv pairs -> accuracy at the query positions
    test_acc: dict[int, float]
    final_loss: float
    diverged: bool


def build_model(arm: str, shape: ModelShape, seed: int) -> RecallModel:
    torch.manual_seed(seed)
    mixer = make_mixer(arm, shape.d_model, shape.heads, shape.head_dim, shape.memories, shape.top_k,
                       shape.expanded_key_dim, chunk_size=None)  # sequences of <= 3 * 32 tokens: one chunk is fastest
    hidden = shape.expanded_mlp_hidden if arm == EXPANDED else None
    return RecallModel(vocab_size(shape.key_vocab, shape.value_vocab), shape.d_model, shape.layers, mixer, hidden)


def _eval_sets(pairs: tuple[int, ...], n: int, seed: int, shape: ModelShape) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return {N: mqar_batch(N, n, gen, shape.key_vocab, shape.value_vocab) for N in pairs}


@torch.no_grad()
def accuracy(model: RecallModel, sets: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> dict[int, float]:
    model.eval()
    out = {}
    for N, (x, y) in sets.items():
        pred = model(x)[0].argmax(-1)
        mask = y != IGNORE
        out[N] = float((pred[mask] == y[mask]).float().mean())
    model.train()
    return out


def train_run(arm: str, shape: ModelShape, pairs: tuple[int, ...], lr: float, steps: int, batch: int, seed: int,
              eval_size: int, val_seed: int, test_seed: int,
              return_model: bool = False) -> RunResult | tuple[RunResult, RecallModel]:
    """Train `arm` from `seed` and return its validation and test accuracy per kv-pair count (and the model)."""
    model = build_model(arm, shape, seed)
    gen = torch.Generator().manual_seed(seed + 7919)
    last: dict[str, torch.Tensor] = {}  # the last step's cross-entropy (without the aux term): the run's final loss

    def loss_at(i: int) -> torch.Tensor:
        x, y = mqar_batch(pairs[i % len(pairs)], batch, gen, shape.key_vocab, shape.value_vocab)
        logits, routers = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE)
        last["loss"] = loss.detach()
        aux = aux_loss(routers, shape.top_k)
        return loss if aux is None else loss + AUX_SCALE * aux

    # warmup over the first tenth, cosine over the whole run to 10% (the schedule LambdaLR used to apply)
    schedule = partial(warmup_times_cosine, total_steps=steps, peak_lr=lr, warmup_steps=max(1, steps // 10),
                       floor_ratio=0.1)
    run = fit(model, loss_at, steps, lambda params: torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=0.01),
              schedule=schedule, max_grad_norm=1.0, on_nonfinite="stop")
    diverged = run.diverged is not None
    if diverged:
        nan = {N: math.nan for N in pairs}
        result = RunResult(n_params(model), nan, nan, math.nan, True)
        return (result, None) if return_model else result
    val = accuracy(model, _eval_sets(pairs, eval_size, val_seed, shape))
    test = accuracy(model, _eval_sets(pairs, eval_size, test_seed, shape))
    result = RunResult(n_params(model), val, test, float(last["loss"]), False)
    return (result, model) if return_model else result


__all__ = ["AUX_SCALE", "ModelShape", "RunResult", "build_model", "train_run"]
