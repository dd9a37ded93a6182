"""Measurements shared by the report, the benchmark and the tests: decoding agreement, generation, decode speed."""

from __future__ import annotations

import time

import torch
from torch import nn
from transformers import DynamicCache

from rankwise.compress.mla_deploy.build import set_absorb
from rankwise.compress.mla_deploy.cache import preallocated_cache
from rankwise.errors import InvalidInputError


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


CACHE_KINDS = ("dynamic", "preallocated")


def _new_cache(model: nn.Module, kind: str):
    if kind not in CACHE_KINDS:
        raise InvalidInputError(f"cache must be one of {CACHE_KINDS}, got {kind!r}")
    return DynamicCache(config=model.config) if kind == "dynamic" else preallocated_cache(model.config)


@torch.no_grad()
def decode_tokens_per_second(
    model: nn.Module, context: int, new_tokens: int = 16, vocab_limit: int = 1000, seed: int = 0, *,
    batch: int = 1, cache: str = "dynamic", synthetic_context: bool = False,
) -> float:
    """Decode speed in tokens/s (batch x steps / seconds) of `batch` sequences after a context of `context` tokens.

    The context is a prefill of random token ids (not timed), or with `synthetic_context` one real token followed by
    `context - 1` cached positions of random numbers appended to every layer's cache in the shapes that layer
    caches: decoding reads and attends over the cache exactly as after a real prefill (its values do not change the
    arithmetic), without the prefill's cost, which at batch 8 x 8,192 tokens is minutes on a CPU. cache:
    "dynamic" (transformers' DynamicCache, which appends by torch.cat) or "preallocated" (`cache.py`)."""
    gen = torch.Generator().manual_seed(seed)
    kv = _new_cache(model, cache)
    prompt = 1 if synthetic_context else context
    ids = torch.randint(0, vocab_limit, (batch, prompt), generator=gen)
    out = model(input_ids=ids, cache=kv, use_cache=True)
    if synthetic_context and context > 1:
        for layer in kv.layers:
            k, v = layer.keys, layer.values
            fill = dict(generator=gen, dtype=k.dtype)
            layer.update(torch.randn(*k.shape[:-2], context - 1, k.shape[-1], **fill).to(k.device),
                         torch.randn(*v.shape[:-2], context - 1, v.shape[-1], **fill).to(v.device))
    token = out.logits[:, -1:].argmax(-1)
    model(input_ids=token, cache=kv, use_cache=True)  # one warm-up step
    start = time.perf_counter()
    for _ in range(new_tokens):
        out = model(input_ids=token, cache=kv, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
    return batch * new_tokens / (time.perf_counter() - start)
