"""KV-cache bytes per token: measured from the cache tensors a forward pass produces, and predicted from a config."""

from __future__ import annotations

import torch
from torch import nn


def cache_tensor_bytes(cache: object, _seen: set[int] | None = None) -> int:
    """Total bytes of every tensor reachable inside a cache object (DynamicCache, tuples of tensors, custom caches)."""
    seen = set() if _seen is None else _seen
    if id(cache) in seen:
        return 0
    seen.add(id(cache))
    if isinstance(cache, torch.Tensor):
        return cache.numel() * cache.element_size()
    if isinstance(cache, (list, tuple)):
        return sum(cache_tensor_bytes(c, seen) for c in cache)
    if isinstance(cache, dict):
        return sum(cache_tensor_bytes(c, seen) for c in cache.values())
    if hasattr(cache, "__dict__") and not isinstance(cache, (nn.Module, type)):
        return sum(cache_tensor_bytes(v, seen) for v in vars(cache).values() if isinstance(v, (torch.Tensor, list, tuple, dict)) or hasattr(v, "__dict__"))
    return 0


@torch.no_grad()
def measured_kv_bytes_per_token(model: nn.Module, short: int = 8, long: int = 40, vocab_limit: int = 1000) -> float:
    """Bytes the model's cache grows by per token: (bytes at `long` - bytes at `short`) / (long - short).

    The difference cancels any fixed-size state; a forward with use_cache=True fills the cache.
    """
    gen = torch.Generator().manual_seed(0)
    sizes = []
    for n in (short, long):
        ids = torch.randint(0, vocab_limit, (1, n), generator=gen)
        out = model(input_ids=ids, use_cache=True)
        # transformers 5 names the returned cache `cache` (formerly `past_key_values`).
        cache = out["cache"] if "cache" in out else out["past_key_values"]
        sizes.append(cache_tensor_bytes(cache))
    return (sizes[1] - sizes[0]) / (long - short)


def config_kv_bytes_per_token(config, dtype: torch.dtype = torch.float32) -> int:
    """2 (K and V) x layers x KV heads x head dim x element size, for standard (GQA/MHA) attention."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()
