"""The shared calibration pipeline: data -> forward hooks on named modules -> float64 uncentred second moments.

`run_with_input_hooks` is the one place hooks are registered on named modules during a pass over batches (and
removed again, also on error); `collect_second_moments` and PLoP's NFN scoring are built on it.

For each hooked module we accumulate S = sum_t x_t x_t^T over every token's input row x_t (float64, uncentred) and
the row count n. Damping is applied on use (`SecondMoment.covariance`), never baked into what is stored, so one
cached collection serves every damping setting. Results are cached on disk under a key of model fingerprint, data
and settings; a corrupt cache file is detected and recomputed.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rankwise.core.cache import cache_key, cached_entry, store_entry
from rankwise.core.io import load_tensors, save_tensors_atomic
from rankwise.core.progress import progress
from rankwise.errors import CorruptFileError, InvalidInputError, NumericalError

CACHE_VERSION = 1
CACHE_NAMESPACE = "calibration"  # $RANKWISE_CACHE/calibration/<key>/: one hash-checked entry per setting
CACHE_FILE = "moments.safetensors"


@dataclass
class SecondMoment:
    """Uncentred second moment of a module's input: `sum_xxT` [d, d] float64 over `rows` input rows."""

    sum_xxT: torch.Tensor
    rows: int

    @property
    def dim(self) -> int:
        return self.sum_xxT.size(0)

    def covariance(self, damping: float = 0.0) -> torch.Tensor:
        """C = S / n + damping * mean(diag(S / n)) * I, float64 [d, d] (relative damping keeps it scale-free)."""
        c = self.sum_xxT / self.rows
        if damping:
            c = c + damping * c.diagonal().mean() * torch.eye(self.dim, dtype=c.dtype)
        return c


def module_input_rows(x: torch.Tensor) -> torch.Tensor:
    """A module input [..., d] as rows [N, d]: one row per token."""
    return x.reshape(-1, x.size(-1))


OnInput = Callable[[str, nn.Module, torch.Tensor, Any, int], None]
"""on_input(name, module, x, output, batch_index): x is the module's first input [..., d], output what it returned."""


def _named(model: nn.Module, module_names: Sequence[str]) -> dict[str, nn.Module]:
    modules = dict(model.named_modules())
    missing = [n for n in module_names if n not in modules]
    if missing:
        raise InvalidInputError(f"no module named {missing[:3]} in the model (e.g. {list(modules)[1:4]})")
    return {n: modules[n] for n in module_names}


@contextmanager
def input_hooks(model: nn.Module, module_names: Sequence[str], on_input: Callable[[str, nn.Module, torch.Tensor, Any], None]) -> Iterator[None]:
    """Within the block, every forward of a named module calls `on_input(name, module, x, output)`; the hooks are
    removed on leaving it, whether the block finished or raised."""
    modules = _named(model, module_names)
    handles = []
    try:
        for name, module in modules.items():
            handles.append(module.register_forward_hook(lambda m, inputs, output, name=name: on_input(name, m, inputs[0], output)))
        yield
    finally:
        for h in handles:
            h.remove()


def default_forward(model: nn.Module) -> Callable[[Any], Any]:
    """How a batch is fed: a dict as keyword arguments, token ids [B, T] as `input_ids` (transformers models)."""
    def forward(batch):
        if isinstance(batch, dict):
            return model(**batch)
        return model(input_ids=batch) if hasattr(model, "config") else model(batch)

    return forward


@torch.no_grad()
def run_with_input_hooks(
    model: nn.Module,
    module_names: Sequence[str],
    batches: Iterable[Any],
    on_input: OnInput,
    *,
    forward: Callable[[Any], Any] | None = None,
    desc: str = "calibration",
) -> None:
    """Run `model` (in eval mode, without grad) over `batches`, calling `on_input(name, module, x, output, i)` for
    each named module's forward during batch i. `forward(batch)` runs one batch (default: `default_forward(model)`;
    it may call a part of `model`, e.g. the backbone without the LM head). Hooks and the training flag are restored
    afterwards, also on error. Raises InvalidInputError for unknown module names.
    """
    run = forward or default_forward(model)
    current = {"batch": 0}
    was_training = model.training
    with input_hooks(model, module_names, lambda name, m, x, out: on_input(name, m, x, out, current["batch"])):
        model.eval()
        try:
            for i, batch in enumerate(progress(batches, desc=desc)):
                current["batch"] = i
                run(batch)
        finally:
            model.train(was_training)


def model_fingerprint(model: nn.Module) -> str:
    """A cheap identity of a model's weights: names, shapes, and sums and leading values of every tensor."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        flat = t.detach().reshape(-1)
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        if flat.numel():
            h.update(flat[:16].double().numpy().tobytes())
            h.update(flat.double().sum().numpy().tobytes())
    return h.hexdigest()[:24]


def data_fingerprint(batches: Sequence[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for b in batches:
        h.update(str(tuple(b.shape)).encode())
        h.update(b.contiguous().numpy().tobytes())
    return h.hexdigest()[:24]


@torch.no_grad()
def collect_second_moments(
    model: nn.Module,
    module_names: Sequence[str],
    batches: Iterable[torch.Tensor],
    *,
    min_rows: int = 1,
    use_cache: bool = True,
    desc: str = "calibration",
) -> dict[str, SecondMoment]:
    """Run `model` over `batches` of input ids [B, T] and return each named module's input second moment.

    Raises InvalidInputError for unknown module names or too little data (fewer than `min_rows` rows per module),
    NumericalError if an activation is NaN or Inf.
    """
    batches = list(batches)
    if not batches:
        raise InvalidInputError("the calibration set is empty: pass at least one batch of token ids")
    _named(model, module_names)
    if not module_names:
        raise InvalidInputError("no modules to calibrate")

    key = cache_key(v=CACHE_VERSION, model=model_fingerprint(model), data=data_fingerprint(batches), modules=list(module_names))
    entry = cached_entry(CACHE_NAMESPACE, key) if use_cache else None  # SHA-256 checked; a bad entry is recomputed
    if entry is not None:
        try:
            return _load(entry / CACHE_FILE, module_names)
        except CorruptFileError as e:
            warnings.warn(f"discarding an unreadable calibration cache entry ({e}); recomputing it", stacklevel=2)

    sums: dict[str, torch.Tensor] = {}
    rows: dict[str, int] = {n: 0 for n in module_names}

    def accumulate(name: str, _module: nn.Module, inputs: torch.Tensor, _output, _batch: int) -> None:
        x = module_input_rows(inputs).double()
        if not torch.isfinite(x).all():
            raise NumericalError(f"non-finite activation entering {name} during calibration")
        sums[name] = sums[name] + x.T @ x if name in sums else x.T @ x
        rows[name] += x.size(0)

    run_with_input_hooks(model, module_names, batches, accumulate, desc=desc)

    too_few = {n: r for n, r in rows.items() if r < min_rows}
    if too_few:
        raise InvalidInputError(f"calibration too short: modules saw {too_few} input rows, need at least {min_rows}; pass more data")
    moments = {n: SecondMoment(sums[n], rows[n]) for n in module_names}
    if use_cache:
        tensors = {f"{n}.sum_xxT": m.sum_xxT for n, m in moments.items()}
        tensors.update({f"{n}.rows": torch.tensor([m.rows], dtype=torch.long) for n, m in moments.items()})
        store_entry(CACHE_NAMESPACE, key, lambda tmp: save_tensors_atomic(tmp / CACHE_FILE, tensors, metadata={"version": str(CACHE_VERSION)}))
    return moments


def _load(path, module_names: Sequence[str]) -> dict[str, SecondMoment]:
    tensors = load_tensors(path)
    try:
        return {n: SecondMoment(tensors[f"{n}.sum_xxT"], int(tensors[f"{n}.rows"][0])) for n in module_names}
    except KeyError as e:
        raise CorruptFileError(f"{path} lacks {e}") from e
