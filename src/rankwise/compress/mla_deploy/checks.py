"""Measurements shared by the report, the benchmark and the tests: decoding agreement, generation, decode speed."""

from __future__ import annotations

import time

import torch
from torch import nn
from transformers import DynamicCache

from rankwise.compress.mla_deploy.build import set_absorb


@torch.no_grad()
def absorbed_vs_expanded(model: nn.Module, ids: torch.Tensor, decode_steps: int = 4) -> float:
    """Max |logit| difference between absorbed and expanded MLA decoding, over a prefill of ids [B, T] and
    `decode_steps` cached single-token steps (greedy). The model is left in absorbed mode."""
    runs = []
    for absorb in (True, False):
        set_absorb(model, absorb)
        cache = DynamicCache(config=model.config)
        out = model(input_ids=ids, cache=cache, use_cache=True)
        logits = [out.logits]
        token = out.logits[:, -1:].argmax(-1)
        for _ in range(decode_steps):
            out = model(input_ids=token, cache=cache, use_cache=True)
            logits.append(out.logits)
            token = out.logits[:, -1:].argmax(-1)
        runs.append(torch.cat(logits, dim=1))
    set_absorb(model, True)
    if runs[0].shape != runs[1].shape:  # greedy paths diverged: the logits already disagree beyond rounding
        return float("inf")
    return float((runs[0] - runs[1]).abs().max())


@torch.no_grad()
def greedy_without_cache(model: nn.Module, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy continuation by full forwards with no cache at all. ids [B, T] -> [B, T + new_tokens]."""
    seq = ids
    for _ in range(new_tokens):
        nxt = model(input_ids=seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
    return seq


@torch.no_grad()
def generation_mismatches(model: nn.Module, ids: torch.Tensor, new_tokens: int = 12) -> int:
    """Tokens where `model.generate` (greedy, latent cache) differs from the no-cache greedy continuation."""
    cached = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, attention_mask=torch.ones_like(ids))
    plain = greedy_without_cache(model, ids, new_tokens)
    return int((cached[:, ids.size(1):] != plain[:, ids.size(1):]).sum())


@torch.no_grad()
def decode_tokens_per_second(model: nn.Module, context: int, new_tokens: int = 16, vocab_limit: int = 1000, seed: int = 0) -> float:
    """Single-sequence decode speed after a prefill of `context` random tokens (prefill not timed)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_limit, (1, context), generator=gen)
    cache = DynamicCache(config=model.config)
    out = model(input_ids=ids, cache=cache, use_cache=True)
    token = out.logits[:, -1:].argmax(-1)
    model(input_ids=token, cache=cache, use_cache=True)  # one warm-up step
    start = time.perf_counter()
    for _ in range(new_tokens):
        out = model(input_ids=token, cache=cache, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
    return new_tokens / (time.perf_counter() - start)
