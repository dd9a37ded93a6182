"""What the benchmarks here share for memory: the bytes autograd saves for the backward, the peak of live tensor
bytes on the CPU, and CUDA's peak allocation.

The saved bytes are the activation memory of training, the part of the peak that grows with batch and sequence;
they are exact and deterministic where an allocator's peak on a shared CPU is not. Benchmarks are scripts
(`python benchmarks/bench_X.py`), so this module is imported from the script's own folder.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


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


class _LiveTensorBytes(TorchDispatchMode):
    """Counts the bytes of every storage an op creates while the mode is on, until the storage is freed (a weakref
    finalizer on its Python object, which torch keeps alive exactly as long as the storage); `existing` tensors
    (parameters, optimizer states, the batch) are counted from the start. Each storage once, views included."""

    def __init__(self, existing: Iterable[torch.Tensor]) -> None:
        super().__init__()
        self.current = 0
        self.peak = 0
        self._bytes: dict[int, int] = {}
        for t in existing:
            self._track(t)
        self.start = self.current

    def _track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = id(storage)
        if key in self._bytes:
            return
        self._bytes[key] = storage.nbytes()
        self.current += self._bytes[key]
        self.peak = max(self.peak, self.current)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.current -= self._bytes.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 (torch's signature)
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._track(t)
        return out


def live_tensor_peak(fn: Callable[[], Any], existing: Iterable[torch.Tensor] = ()) -> tuple[int, int, Any]:
    """(peak bytes of live tensors while fn() runs, bytes live at its start, fn's result): the CPU's counterpart of
    CUDA's allocator peak, without the allocator's and the interpreter's overheads. `existing`: the tensors alive
    before fn (parameters, gradients, optimizer states, inputs), counted from the start. torch's own MemTracker
    (`torch.distributed._tools.mem_tracker`) measures the same but refuses a model with frozen parameters (it hooks
    every parameter's gradient), which LoRA and the memory-efficient methods have."""
    mode = _LiveTensorBytes(existing)
    with mode:
        out = fn()
    return mode.peak, mode.start, out
