"""The frozen-prefix cache, one facility for decoders and encoders.

When only the top of a model is adapted, everything below the first adapted module is a fixed function of the input:
that module's input is computed once per example and cached, and a training step runs only the top on it (the same
numbers as a full forward, at a fraction of the cost on a CPU). What every architecture shares is written here:

- `module_inputs(module, forward)`: the inputs of `module` when `forward()` runs the model that holds it; the forward
  stops there, so nothing above the cached point is computed;
- `CachedExamples`: a cache's named per-example entries, stacked tensors [N, ...] or `Ragged` lists of [T_i, ...]
  (right-padded per batch), with `take(indices)` (a training batch) and `chunks(size)` (evaluation in slices);
- `CachedTask`: the data half of the loop's `Task` over a cache (`num_train`, `batch`); a task adds its loss;
- `eval_mode(module)`, `batches(n, size)`.

The per-architecture parts build on it. Decoders: `training.frozen_prefix` (`FrozenPrefixRunner`: the states entering
layer `start`, and the top layers, final norm and LM head run on them) and `training.top_layers_lm` (next-token tasks
on those states). Encoders: `training.cached_classification` (the states entering layer `start`, the classification
task) and `training.encoder_top` (the top layers, mean pooling and a head). A cache point inside a layer (an FFN's
output projection) uses `module_inputs` directly.

Cache with the model in eval mode: a cached dropout draw would be frozen into every epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import nn

from rankwise.core.padding import pad_batch
from rankwise.errors import InvalidInputError


def batches(n: int, size: int) -> Iterator[slice]:
    """Consecutive slices of `size` items (the last one shorter) covering range(n)."""
    if size < 1:
        raise InvalidInputError(f"a batch size must be positive, got {size}")
    for i in range(0, n, size):
        yield slice(i, i + size)


class ModuleInputs(NamedTuple):
    """The positional and keyword arguments one call of a module received."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def first(self, name: str = "hidden_states") -> torch.Tensor:
        """The first input: the first positional argument, else the keyword `name` (transformers' layers)."""
        return self.args[0] if self.args else self.kwargs[name]


class _Reached(Exception):
    """Raised by `module_inputs`' hook to end the forward at the cached point."""


@torch.no_grad()
def module_inputs(module: nn.Module, forward: Callable[[], object]) -> ModuleInputs:
    """The inputs of the first call of `module` during `forward()` (a forward of the model holding it). The forward
    is stopped there: the module and everything after it never run."""
    got: list[ModuleInputs] = []

    def hook(_module: nn.Module, args: tuple, kwargs: dict) -> None:
        got.append(ModuleInputs(args, kwargs))
        raise _Reached

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        forward()
    except _Reached:
        pass
    finally:
        handle.remove()
    if not got:
        raise InvalidInputError(f"the forward never called the module to cache the inputs of ({type(module).__name__})")
    return got[0]


@dataclass(frozen=True)
class Ragged:
    """Per-example tensors of different lengths, items[i] [T_i, ...]; a batch is right-padded with `pad`."""

    items: list[torch.Tensor]
    pad: float | int

    def __len__(self) -> int:
        return len(self.items)

    def take(self, indices: list[int]) -> torch.Tensor:
        """[B, max T_i, ...] for the examples `indices`, right-padded."""
        return pad_batch([self.items[i] for i in indices], self.pad)


Entry = torch.Tensor | Ragged


def take(entries: Mapping[str, Entry], indices: torch.Tensor) -> dict[str, torch.Tensor]:
    """The batch of examples `indices` [B]: stacked entries indexed, ragged ones right-padded."""
    listed = indices.tolist() if any(isinstance(v, Ragged) for v in entries.values()) else None
    return {k: v.take(listed) if isinstance(v, Ragged) else v[indices] for k, v in entries.items()}


def chunks(entries: Mapping[str, Entry], size: int) -> Iterator[dict[str, torch.Tensor]]:
    """Consecutive batches of at most `size` examples, in order (stacked entries as slices)."""
    n = _count(entries)
    for part in batches(n, size):
        yield {k: v.take(list(range(n)[part])) if isinstance(v, Ragged) else v[part] for k, v in entries.items()}


def _count(entries: Mapping[str, Entry]) -> int:
    sizes = {k: (len(v) if isinstance(v, Ragged) else v.size(0)) for k, v in entries.items()}
    if not sizes or len(set(sizes.values())) != 1:
        raise InvalidInputError(f"a cache's entries must hold the same number of examples, got {sizes}")
    return next(iter(sizes.values()))


class CachedExamples:
    """A cache: named per-example entries (stacked [N, ...] or `Ragged`), read as attributes (`cache.h`)."""

    def __init__(self, **entries: Entry) -> None:
        self._n = _count(entries)
        self.entries: dict[str, Entry] = entries

    def __getattr__(self, name: str) -> Entry:
        entries = self.__dict__.get("entries", {})
        if name in entries:
            return entries[name]
        raise AttributeError(f"{type(self).__name__} has no entry {name!r} (it holds {sorted(entries)})")

    def __len__(self) -> int:
        return self._n

    def take(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        return take(self.entries, indices)

    def chunks(self, size: int) -> Iterator[dict[str, torch.Tensor]]:
        return chunks(self.entries, size)


class CachedTask:
    """The loop's task over a cache, data half: the loop samples `train_set`; a subclass adds `name`, `metric`,
    `higher_is_better`, `loss(module, batch)` and `evaluate(module)` (the `core.training.Task` protocol)."""

    def __init__(self, train_set: CachedExamples | None) -> None:
        self.train_set = train_set

    @property
    def num_train(self) -> int:
        if self.train_set is None:
            raise InvalidInputError(f"{type(self).__name__} has no training cache yet (set train_set)")
        return len(self.train_set)

    def batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.train_set.take(indices)


@contextmanager
def eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    """`module` in eval mode for the block; its mode is restored after."""
    was = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was)
