"""Optimizer-state memory, measured from the tensors an optimizer actually holds."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def optimizer_state_bytes(optimizer: torch.optim.Optimizer, params: Iterable[torch.Tensor] | None = None) -> int:
    """Bytes of all tensors in `optimizer.state` (optionally only the states of `params`).

    Walks nested dicts, lists and plain objects (GaLore keeps its projector as an object in the state) and counts
    each tensor's own elements (numel * itemsize) once. A view counts its elements, not the storage behind it:
    galore-torch keeps its projector as a slice U[:, :r] of a full SVD factor, which retains more memory than the
    method needs; this function measures the method. Python numbers count zero bytes; 0-d step tensors a few.
    """
    wanted = None if params is None else {id(p) for p in params}
    seen: set[tuple[int, int]] = set()
    total = 0
    for p, state in optimizer.state.items():
        if wanted is not None and id(p) not in wanted:
            continue
        for t in _tensors_in(state, depth=0):
            key = (t.data_ptr(), t.numel(), t.element_size())
            if key not in seen:
                seen.add(key)
                total += t.numel() * t.element_size()
    return total


def _tensors_in(obj: Any, depth: int) -> Iterable[torch.Tensor]:
    if depth > 4:  # state is shallow; the bound guards against cycles in foreign objects
        return
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors_in(v, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors_in(v, depth + 1)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        for v in vars(obj).values():
            yield from _tensors_in(v, depth + 1)
