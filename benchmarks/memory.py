"""What the benchmarks here share for memory: the bytes autograd saves for the backward, and CUDA's peak allocation.

The saved bytes are the activation memory of training, the part of the peak that grows with batch and sequence;
they are exact and deterministic where an allocator's peak on a shared CPU is not. Benchmarks are scripts
(`python benchmarks/bench_X.py`), so this module is imported from the script's own folder.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch


def saved_tensor_bytes(fn: Callable[[], Any], exclude: Iterable[torch.Tensor] = (),
                       by_storage: bool = True) -> tuple[int, Any]:
    """(bytes of the tensors autograd saves for the backward while fn() runs, fn's result). `by_storage`: each
    storage once, at its full size; otherwise every saved tensor's numel x element size, repeats included. Tensors
    whose storage is one of `exclude`'s (parameters, frozen weights: not extra memory) are not counted."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    storages: dict[int, int] = {}
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        s = t.untyped_storage()
        if s.data_ptr() not in skip:
            storages[s.data_ptr()] = s.nbytes()
            total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return (sum(storages.values()) if by_storage else total), out


def cuda_peak_bytes(fn: Callable[[], Any]) -> int:
    """torch.cuda's peak allocated bytes while fn() runs (the peak statistics are reset first)."""
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()
