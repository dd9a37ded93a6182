"""The shared calibration pipeline: data -> forward hooks on named modules -> float64 uncentred second moments.

For each hooked module we accumulate S = sum_t x_t x_t^T over every token's input row x_t (float64, uncentred) and
the row count n. Damping is applied on use (`SecondMoment.covariance`), never baked into what is stored, so one
cached collection serves every damping setting. Results are cached on disk under a key of model fingerprint, data
and settings; a corrupt cache file is detected and recomputed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from rankwise.core.cache import cache_dir, cache_key
from rankwise.core.io import load_tensors, save_tensors_atomic
from rankwise.core.progress import progress
from rankwise.errors import CorruptFileError, InvalidInputError, NumericalError

CACHE_VERSION = 1


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


def module_input_rows(inputs: tuple) -> torch.Tensor:
    x = inputs[0]
    return x.reshape(-1, x.size(-1))


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
    modules = dict(model.named_modules())
    missing = [n for n in module_names if n not in modules]
    if missing:
        raise InvalidInputError(f"no module named {missing[:3]} in the model (e.g. {list(modules)[1:4]})")
    if not module_names:
        raise InvalidInputError("no modules to calibrate")

    key = cache_key(v=CACHE_VERSION, model=model_fingerprint(model), data=data_fingerprint(batches), modules=list(module_names))
    path = cache_dir("calibration") / f"{key}.safetensors"
    if use_cache and path.is_file():
        try:
            return _load(path, module_names)
        except CorruptFileError:
            path.unlink(missing_ok=True)

    sums: dict[str, torch.Tensor] = {}
    rows: dict[str, int] = {n: 0 for n in module_names}

    def hook_for(name: str):
        def hook(_module: nn.Module, inputs: tuple) -> None:
            x = module_input_rows(inputs).double()
            if not torch.isfinite(x).all():
                raise NumericalError(f"non-finite activation entering {name} during calibration")
            sums[name] = sums[name] + x.T @ x if name in sums else x.T @ x
            rows[name] += x.size(0)

        return hook

    handles = [modules[n].register_forward_pre_hook(hook_for(n)) for n in module_names]
    was_training = model.training
    model.eval()
    try:
        for batch in progress(batches, desc=desc):
            model(input_ids=batch) if hasattr(model, "config") else model(batch)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)

    too_few = {n: r for n, r in rows.items() if r < min_rows}
    if too_few:
        raise InvalidInputError(f"calibration too short: modules saw {too_few} input rows, need at least {min_rows}; pass more data")
    moments = {n: SecondMoment(sums[n], rows[n]) for n in module_names}
    if use_cache:
        tensors = {f"{n}.sum_xxT": m.sum_xxT for n, m in moments.items()}
        tensors.update({f"{n}.rows": torch.tensor([m.rows], dtype=torch.long) for n, m in moments.items()})
        save_tensors_atomic(path, tensors, metadata={"version": str(CACHE_VERSION)})
    return moments


def _load(path, module_names: Sequence[str]) -> dict[str, SecondMoment]:
    tensors = load_tensors(path)
    try:
        return {n: SecondMoment(tensors[f"{n}.sum_xxT"], int(tensors[f"{n}.rows"][0])) for n in module_names}
    except KeyError as e:
        raise CorruptFileError(f"{path} lacks {e}") from e
