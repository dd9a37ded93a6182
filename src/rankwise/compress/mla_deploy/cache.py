"""A KV cache that appends in place: `PreallocatedCache`, a transformers DynamicCache without the per-step copy.

transformers' DynamicLayer appends by `torch.cat([cached, new])`: every decoding step copies the whole cache of
every layer (read + write of all cached bytes) before attention reads it once more, so at long context the copy costs
twice what the attention's own read does. Here each layer keeps a buffer with spare room for `chunk` more tokens;
appending writes the new tokens into it and the layer's `keys`/`values` are views of its first `length` tokens, so a
step touches only the new token, and the buffer is copied only when it fills (once per `chunk` steps). The cache
works for any model whose layers append to a DynamicCache: GQA (keys/values [B, H, T, d]) and deployable MLA (latent
[B, 1, T, r_K + r_V], rope key [B, 1, T, 2k]) alike, so benchmarks can give both the same cache.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rankwise.errors import InvalidInputError

DEFAULT_CHUNK = 256  # spare tokens per growth: the copy on growth is amortised over this many steps


class PreallocatedLayer(DynamicLayer):
    """A DynamicLayer whose `keys`/`values` [B, H, T, d] are views of buffers [B, H, T + spare, d]."""

    def __init__(self, chunk: int = DEFAULT_CHUNK) -> None:
        super().__init__()
        self.chunk = chunk
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None
        self._views: tuple[torch.Tensor, torch.Tensor] | None = None  # the `keys`/`values` the last append set
        self._length = 0  # tokens in them

    def _owns(self) -> bool:
        """Whether `keys`/`values` are still views of our buffers (crop, reorder or batch ops of transformers
        replace them by fresh tensors; the next append then adopts those)."""
        k, v, kb, vb = self.keys, self.values, self._key_buffer, self._value_buffer
        return (kb is not None and vb is not None and k.data_ptr() == kb.data_ptr() and v.data_ptr() == vb.data_ptr()
                and k.shape[:-2] == kb.shape[:-2] and v.shape[:-2] == vb.shape[:-2])

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        views = self._views
        if views is not None and self.keys is views[0] and self.values is views[1]:
            length = self._length  # decoding: nothing touched the cache since our last append (checked per layer and step)
        else:
            length = self.keys.shape[-2] if self.keys.numel() else 0
            if not (length and self._owns()):
                self._key_buffer = self._value_buffer = None  # adopt transformers' tensors (a crop keeps our buffers)
        new = key_states.shape[-2]
        if self._key_buffer is None or length + new > self._key_buffer.shape[-2]:
            capacity = length + new + self.chunk
            self._key_buffer = self._grow(self.keys, key_states, length, capacity)
            self._value_buffer = self._grow(self.values, value_states, length, capacity)
        self._key_buffer.narrow(-2, length, new).copy_(key_states)
        self._value_buffer.narrow(-2, length, new).copy_(value_states)
        self.keys = self._key_buffer.narrow(-2, 0, length + new)
        self.values = self._value_buffer.narrow(-2, 0, length + new)
        self._views, self._length = (self.keys, self.values), length + new
        return self.keys, self.values

    @staticmethod
    def _grow(cached: torch.Tensor, new: torch.Tensor, length: int, capacity: int) -> torch.Tensor:
        buffer = new.new_empty((*new.shape[:-2], capacity, new.shape[-1]))
        if length:
            buffer[..., :length, :].copy_(cached)
        return buffer

    def reset(self) -> None:
        self._key_buffer = self._value_buffer = self._views = None
        super().reset()


def preallocated_cache(config, chunk: int = DEFAULT_CHUNK) -> DynamicCache:
    """A DynamicCache for `config` (the model's config) whose layers append in place (`PreallocatedLayer`).

    Drop-in for `DynamicCache(config=config)` in `model(..., cache=...)` and `model.generate(past_key_values=...)`;
    refuses configs with sliding-window layers, which DynamicCache handles with another layer type."""
    if not isinstance(chunk, int) or chunk < 1:
        raise InvalidInputError(f"chunk must be a positive int, got {chunk!r}")
    cache = DynamicCache(config=config)
    if any(type(layer) is not DynamicLayer for layer in cache.layers):
        raise InvalidInputError("preallocated_cache supports full-attention layers only (this config has sliding-window layers)")
    cache.layers = [PreallocatedLayer(chunk) for _ in cache.layers]
    return cache
